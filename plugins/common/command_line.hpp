// One convention for the command line of every `ballast` command, built-in
// or from a plugin: options parsed by CLI11, `--help` on stdout with exit 0,
// and a usage error (an unknown option or verb, a missing or bad value) on
// stderr with exit 2, naming what was wrong and the closest valid option or
// verb.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace ballast::util {

// The exit code of a usage error, as getopt and argparse use.
inline constexpr int kUsageError = 2;

// Parses argv (argv[0] is the command's name) into app. Returns -1 when the
// command goes on, 0 after --help (printed to out), kUsageError after a
// usage error (printed to err). An argument that no option, positional or
// subcommand takes is a usage error, even where app allows extras.
int parse_command_line(CLI::App& app, int argc, char** argv, std::FILE* out = stdout, std::FILE* err = stderr);

// The same for arguments already split off argv (argv[0] not included).
int parse_command_line(CLI::App& app, std::vector<std::string> args, std::FILE* out = stdout, std::FILE* err = stderr);

// A finite number in [min, max] (CLI::Range lets NaN through).
CLI::Validator NumberIn(double min, double max);

// Prints "NAME: what" and where to find the usage to err; returns kUsageError.
// For the checks a command makes after parsing (an option needed with another).
int usage_error(const CLI::App& app, const std::string& what, std::FILE* err = stderr);

// The candidate nearest to word by edit distance (a swap of two neighbours
// counts one), if near enough to be a typo of it; empty otherwise.
std::string closest(std::string_view word, const std::vector<std::string>& candidates);

// "unknown option '--jsn' (did you mean '--json'?)" for an argument that app
// (or the subcommand it was given to) does not take.
std::string unknown_argument(const CLI::App& app, const std::string& arg);

}  // namespace ballast::util
