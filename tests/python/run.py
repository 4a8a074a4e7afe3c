"""Run one unittest module (its tests matching the optional second argument,
a unittest -k pattern); exit 0 when it passed, 77 when every test in it
was skipped (ctest reports it skipped, with the reasons printed), 1 else."""
import importlib.util
import os
import sys
import unittest


def main():
    path = sys.argv[1]
    sys.path.insert(0, os.path.dirname(path))
    spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    loader = unittest.TestLoader()
    if len(sys.argv) > 2:
        loader.testNamePatterns = [f"*{sys.argv[2]}*"]
    suite = loader.loadTestsFromModule(module)
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    if not result.wasSuccessful():
        return 1
    if result.testsRun and len(result.skipped) == result.testsRun:
        for test, why in result.skipped:
            print(f"skipped: {test.id()}: {why}")
        return 77
    return 0


if __name__ == "__main__":
    sys.exit(main())
