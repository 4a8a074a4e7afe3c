// For fuzz targets whose input goes through large buffers that the parser
// allocates per input (libyaml's 64 KiB for meta.yaml and topology.yaml, the gzip
// reader's 128 KiB for metrics CSV): ASan's
// default 256 MiB quarantine keeps freed memory from reuse for thousands of
// inputs, so every input gets fresh pages, and their page faults and the
// allocator refilling its free lists cost more than the parse itself.
// 16 MiB still holds an input's frees for over a hundred inputs past its end:
// a use after free within one input is caught as before.
// Include from the target's one source file (it defines ASan's hook).
#pragma once

extern "C" const char* __asan_default_options() { return "quarantine_size_mb=16"; }
