#include "command_line.hpp"

#include <algorithm>
#include <cstdlib>

namespace ballast::util {

namespace {

// Edit distance with a swap of two neighbours counting one (optimal string
// alignment). The words are command-line arguments: short.
size_t distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// The subcommand chain the arguments selected: app, then each parsed subcommand.
std::vector<const CLI::App*> parsed_chain(const CLI::App& app) {
  std::vector<const CLI::App*> chain{&app};
  for (;;) {
    const auto subs = chain.back()->get_subcommands();
    if (subs.empty()) return chain;
    chain.push_back(subs.front());
  }
}

std::string full_name(const CLI::App& app) {
  std::string name;
  for (const CLI::App* a : parsed_chain(app)) name += (name.empty() ? "" : " ") + a->get_name();
  return name;
}

// Every option and subcommand name valid where the arguments stopped.
std::vector<std::string> valid_words(const CLI::App& app, bool* has_subcommands) {
  std::vector<std::string> words;
  const auto chain = parsed_chain(app);
  for (const CLI::App* a : chain)
    for (const CLI::Option* o : a->get_options()) {
      for (const auto& l : o->get_lnames()) words.push_back("--" + l);
      for (const auto& s : o->get_snames()) words.push_back("-" + s);
    }
  *has_subcommands = false;
  for (const CLI::App* s : chain.back()->get_subcommands({})) {
    words.push_back(s->get_name());
    *has_subcommands = true;
  }
  return words;
}

int report(const CLI::App& app, const std::string& what, std::FILE* err) {
  std::fprintf(err, "%s: %s\nRun '%s --help' for the usage.\n", full_name(app).c_str(), what.c_str(),
               full_name(app).c_str());
  return kUsageError;
}

template <class Parse>
int parse_with(CLI::App& app, Parse parse, std::FILE* out, std::FILE* err) {
  try {
    parse();
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), out);
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    std::fputs(app.help("", CLI::AppFormatMode::All).c_str(), out);
    return 0;
  } catch (const CLI::CallForVersion& e) {
    std::fprintf(out, "%s\n", e.what());
    return 0;
  } catch (const CLI::ParseError& e) {
    // An unknown argument is named (with a suggestion) before what it may
    // have caused, such as a required option that seems missing. (CLI11
    // runs subcommand callbacks only after a parse without errors.)
    const auto extras = app.remaining(true);
    if (!extras.empty()) return report(app, unknown_argument(app, extras.front()), err);
    const CLI::App* last = parsed_chain(app).back();
    if (last->get_require_subcommand_min() > 0 && last->get_subcommands().empty()) {
      std::string names;
      for (const CLI::App* s : last->get_subcommands({})) names += (names.empty() ? "" : ", ") + s->get_name();
      return report(app, "a command is required: one of " + names, err);
    }
    return report(app, e.what(), err);
  }
  const auto extras = app.remaining(true);
  if (!extras.empty()) return report(app, unknown_argument(app, extras.front()), err);
  return -1;
}

}  // namespace

std::string closest(std::string_view word, const std::vector<std::string>& candidates) {
  const auto core = [](std::string_view w) { return w.substr(std::min(w.find_first_not_of('-'), w.size())); };
  const size_t len = core(word).size();
  const size_t limit = std::max<size_t>(1, (len + 1) / 3);
  std::string best;
  size_t best_d = limit + 1;
  for (const auto& c : candidates) {
    const size_t d = distance(word, c);
    if (d < best_d && d < len) {
      best = c;
      best_d = d;
    }
  }
  return best;
}

std::string unknown_argument(const CLI::App& app, const std::string& arg) {
  bool has_subcommands = false;
  const auto words = valid_words(app, &has_subcommands);
  const bool option = arg.size() > 1 && arg[0] == '-';
  const std::string word = option ? arg.substr(0, arg.find('=')) : arg;
  std::string what = option            ? "unknown option '" + word + "'"
                     : has_subcommands ? "unknown command '" + arg + "'"
                                       : "unexpected argument '" + arg + "'";
  if (const std::string near = closest(word, words); !near.empty()) what += " (did you mean '" + near + "'?)";
  return what;
}

CLI::Validator NumberIn(double min, double max) {
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || *end != '\0' || !(v >= min && v <= max))
          return "expected a number in [" + CLI::detail::to_string(min) + ", " + CLI::detail::to_string(max) +
                 "], got '" + text + "'";
        return std::string();
      },
      "NUMBER in [" + CLI::detail::to_string(min) + ", " + CLI::detail::to_string(max) + "]");
}

int usage_error(const CLI::App& app, const std::string& what, std::FILE* err) { return report(app, what, err); }

int parse_command_line(CLI::App& app, int argc, char** argv, std::FILE* out, std::FILE* err) {
  if (app.get_name().empty() && argc > 0) app.name(argv[0]);
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  return parse_command_line(app, std::move(args), out, err);
}

int parse_command_line(CLI::App& app, std::vector<std::string> args, std::FILE* out, std::FILE* err) {
  std::reverse(args.begin(), args.end());  // CLI11 takes them last first
  return parse_with(
      app, [&] { app.parse(args); }, out, err);
}

}  // namespace ballast::util
