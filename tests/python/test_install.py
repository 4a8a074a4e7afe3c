"""`cmake --install` puts the package where Debian's Python finds it, with
the paths of the installed libballast and plugins: it works with no
BALLAST_LIB or PYTHONPATH pointing into the build."""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest


class InstallTest(unittest.TestCase):
    def test_installed_package_finds_its_library_and_plugins(self):
        prefix = tempfile.mkdtemp(prefix="ballast-py-prefix-")
        try:
            subprocess.run([os.environ["CMAKE_COMMAND"], "--install", os.environ["BALLAST_BINARY_DIR"], "--prefix",
                            prefix], check=True, stdout=subprocess.DEVNULL)
            rel = os.environ["BALLAST_PYTHON_INSTALL_DIR"]
            site = os.path.join(prefix, rel)
            self.assertTrue(os.path.isfile(os.path.join(site, "ballast", "host.py")))
            with open(os.path.join(site, "ballast", "_paths.py")) as f:
                self.assertIn(prefix, f.read())
            # Debian's Python looks there for the default prefix (/usr/local).
            default = "/usr/local/" + rel
            self.assertIn(default, subprocess.run([sys.executable, "-c", "import sys; print(sys.path)"],
                                                  check=True, capture_output=True, text=True).stdout)
            env = {k: v for k, v in os.environ.items()
                   if k not in ("PYTHONPATH", "BALLAST_LIB", "BALLAST_PLUGIN_DIR", "LD_LIBRARY_PATH")}
            env["PYTHONPATH"] = site
            code = ("import ballast, os; h = ballast.Host(); h.load_plugin('straggler'); h.start(); h.close(); "
                    "print(ballast.__file__); print(h.lib._ballast_path)")
            out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True,
                                 text=True).stdout.split()
            self.assertTrue(out[0].startswith(site), out)
            self.assertTrue(out[1].startswith(prefix), out)
        finally:
            shutil.rmtree(prefix)


if __name__ == "__main__":
    unittest.main()
