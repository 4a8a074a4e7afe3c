// Slurm hostlist expressions: expansion, compression, and every malformed form.
#include <doctest/doctest.h>

#include "hostlist.hpp"

using namespace ballast::sched;
using V = std::vector<std::string>;

TEST_CASE("ranges keep the zero padding of their first bound") {
  CHECK(expand_hostlist("gpu[001-003,120]") == V{"gpu001", "gpu002", "gpu003", "gpu120"});
  CHECK(expand_hostlist("n[8-11]") == V{"n8", "n9", "n10", "n11"});
  CHECK(expand_hostlist("tux0") == V{"tux0"});
  CHECK(expand_hostlist("").empty());
}

TEST_CASE("top-level commas separate terms; several bracket groups multiply") {
  CHECK(expand_hostlist("a1,b[1-2],c") == V{"a1", "b1", "b2", "c"});
  CHECK(expand_hostlist("r[1-2]n[01-02]") == V{"r1n01", "r1n02", "r2n01", "r2n02"});
  CHECK(expand_hostlist("rack[1-2]-gpu") == V{"rack1-gpu", "rack2-gpu"});
}

TEST_CASE("malformed hostlists are rejected with the reason") {
  auto err = [](const std::string& s) {
    try {
      expand_hostlist(s);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(err("gpu[001-").find("unclosed '['") != std::string::npos);
  CHECK(err("gpu001]").find("unmatched ']'") != std::string::npos);
  CHECK(err("gpu[[1]]").find("nested '['") != std::string::npos);
  CHECK(err("gpu[]").find("empty brackets") != std::string::npos);
  CHECK(err("gpu[5-2]").find("reversed range") != std::string::npos);
  CHECK(err("gpu[a-b]").find("bad range") != std::string::npos);
  CHECK(err("gpu[1-2-3]").find("bad range") != std::string::npos);
  CHECK(err("gpu[1,]").find("bad range") != std::string::npos);
  CHECK(err("a,,b").find("stray comma") != std::string::npos);
  CHECK(err("a b").find("unexpected ' '") != std::string::npos);
  CHECK(err("n[0-99999999999]").find("expands to more than") != std::string::npos);
  CHECK(err("a[0-9999]b[0-9999]").find("expands to more than") != std::string::npos);
}

TEST_CASE("compression folds consecutive numbers per prefix and width, and round-trips") {
  V names{"gpu001", "gpu002", "gpu003", "gpu007", "login", "n9", "n10"};
  std::string c = compress_hostlist(names);
  CHECK(c == "gpu[001-003,007],login,n[9-10]");
  CHECK(expand_hostlist(c) == names);
  CHECK(compress_hostlist({"x5"}) == "x5");
}
