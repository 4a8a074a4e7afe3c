// Reading traces and meta files: the real traces, any column order, and
// every kind of bad input naming the file, the line and the column.
#include <doctest/doctest.h>

#include <zlib.h>

#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "data.hpp"
#include "trace.hpp"
#include "whatif.hpp"

using namespace ballast::straggler;
using straggler_test::data;
using straggler_test::Scratch;

namespace {

const std::string kHeader = "dp_rank,stage,rank,step,optype,start_ts,duration,seq_id,mc,mb_id,gmc\n";

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const TraceError& e) {
    return e.what();
  }
  return "(no error)";
}

std::string gunzip_file(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  REQUIRE(f != nullptr);
  std::string out;
  char buf[65536];
  int n;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  gzclose(f);
  return out;
}

}  // namespace

TEST_CASE("the real traces are read with every row and field") {
  Trace ar = read_trace(data("AR", "trace.csv.gz"));
  CHECK(ar.rows.size() == 117216);
  const TraceRow& r = ar.rows.front();
  CHECK(r.dp_rank == 0);
  CHECK(r.step == 16);
  CHECK(r.optype == OpType::backward_compute);
  CHECK(r.start == doctest::Approx(2.6883304119110107).epsilon(1e-15));
  CHECK(r.duration == doctest::Approx(0.8543476462364197).epsilon(1e-15));
  CHECK(ar.lines.front() == 2);
  CHECK(ar.where(0) == data("AR", "trace.csv.gz") + ":2");

  Trace st = read_trace(data("ST", "trace.csv.gz"));
  CHECK(st.rows.size() == 6784);
  Meta m = read_meta(data("ST", "meta.yaml"));
  CHECK(m.dp == 2);
  CHECK(m.pp == 4);
  CHECK(m.world == 8);
  CHECK(m.trial_name == "ST");
}

TEST_CASE("plain CSV and columns in another order read the same") {
  Scratch tmp("order");
  std::string text = gunzip_file(data("ST", "trace.csv.gz"));
  Trace gz = read_trace(data("ST", "trace.csv.gz"));
  Trace plain = read_trace(tmp.write("plain.csv", text));
  REQUIRE(plain.rows.size() == gz.rows.size());

  // Reverse the columns of every line, add an unknown column and CRLF endings.
  std::string reversed;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::istringstream ls(line);
    std::string x;
    while (std::getline(ls, x, ',')) f.push_back(x);
    std::string out = reversed.empty() ? "extra" : "42";
    for (auto it = f.rbegin(); it != f.rend(); ++it) out += "," + *it;
    reversed += out + "\r\n";
  }
  Trace rev = read_trace(tmp.write("reversed.csv", reversed));
  REQUIRE(rev.rows.size() == gz.rows.size());
  for (size_t i = 0; i < gz.rows.size(); i += 97) {
    CHECK(rev.rows[i].start == gz.rows[i].start);
    CHECK(rev.rows[i].duration == gz.rows[i].duration);
    CHECK(rev.rows[i].optype == gz.rows[i].optype);
    CHECK(rev.rows[i].seq_id == gz.rows[i].seq_id);
    CHECK(rev.rows[i].gmc == gz.rows[i].gmc);
  }
}

TEST_CASE("bad input is an error naming the file, the line and the column") {
  Scratch tmp("bad");
  const std::string good = "0,0,0,1,forward-compute,0.5,0.25,0,0,0,0\n";
  struct Case {
    const char* name;
    std::string text;
    std::string expect;
  };
  const Case cases[] = {
      {"missing-column", "dp_rank,stage,rank,step,optype,start_ts,duration,seq_id,mc,mb_id\n" + good,
       ":1: column gmc: missing from the header"},
      {"unknown-optype", kHeader + good + "0,0,0,1,warp-drive,0.5,0.25,0,0,0,0\n",
       ":3: column optype: unknown op type 'warp-drive'"},
      {"non-numeric", kHeader + good + "0,0,0,1,forward-compute,0.5,fast,1,0,0,0\n",
       ":3: column duration: 'fast' is not a number"},
      {"nan", kHeader + good + good + "0,0,0,1,forward-compute,nan,0.25,1,0,0,0\n", ":4: column start_ts: NaN"},
      {"infinite", kHeader + "0,0,0,1,forward-compute,0.5,inf,1,0,0,0\n", ":2: column duration: 'inf' is not finite"},
      {"negative", kHeader + "0,0,0,1,forward-compute,0.5,-0.25,1,0,0,0\n",
       ":2: column duration: negative duration -0.25"},
      {"negative-rank", kHeader + "0,-1,0,1,forward-compute,0.5,0.25,1,0,0,0\n",
       ":2: column stage: -1 is out of range"},
      {"short-line", kHeader + good + "0,0,0,1,forward-compute,0.5,0.25\n", ":3: column seq_id: line has 7 fields"},
      {"long-line", kHeader + "0,0,0,1,forward-compute,0.5,0.25,0,0,0,0,7\n", ":2: line has more fields"},
      {"header-only", kHeader, ":1: no operations"},
      {"empty", "", ":1: empty file"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    std::string path = tmp.write(std::string(c.name) + ".csv", c.text);
    std::string err = error_of([&] { read_trace(path); });
    CHECK(err.find(path + c.expect) != std::string::npos);
    if (err.find(path + c.expect) == std::string::npos) MESSAGE(err);
  }
  CHECK(error_of([] { read_trace("/nonexistent/trace.csv"); }).find("/nonexistent/trace.csv: cannot open") == 0);
}

TEST_CASE("a truncated or corrupt gzip stream names where the text stops") {
  Scratch tmp("gzip");
  std::string gz = straggler_test::slurp(data("ST", "trace.csv.gz"));
  std::string path = tmp.write("cut.csv.gz", gz.substr(0, gz.size() / 2));
  std::string err = error_of([&] { read_trace(path); });
  INFO(err);
  CHECK(err.find(path + ":") == 0);
  CHECK(err.find("truncated gzip stream") != std::string::npos);
  // The line is well past the header, and a column is named.
  size_t line = std::stoul(err.substr(path.size() + 1));
  CHECK(line > 1000);
  CHECK(err.find("column ") != std::string::npos);

  std::string corrupt = gz;
  for (size_t i = corrupt.size() / 3; i < corrupt.size() / 3 + 64; ++i) corrupt[i] = static_cast<char>(~corrupt[i]);
  std::string bad = tmp.write("corrupt.csv.gz", corrupt);
  std::string err2 = error_of([&] { read_trace(bad); });
  INFO(err2);
  CHECK(err2.find(bad + ":") == 0);
  CHECK(err2.find("gzip") != std::string::npos);
}

TEST_CASE("the schedule is checked: order of timestamps, missing and duplicated ops") {
  const std::string path = data("ST", "trace.csv.gz");
  Trace st = read_trace(path);
  Meta meta = read_meta(data("ST", "meta.yaml"));

  SUBCASE("a timestamp out of seq_id order") {
    Trace t = st;
    size_t i = 0;
    while (!(t.rows[i].optype == OpType::forward_compute && t.rows[i].seq_id == 2)) ++i;
    t.rows[i].start -= 1.0;
    std::string err = error_of([&] { analyze(t, meta); });
    CHECK(err.find(t.where(i) + ": column start_ts: forward-compute 2 of stage") == 0);
    CHECK(err.find("seq_id must follow start order") != std::string::npos);
  }
  // A row outside the first step's dp_rank 0, from which the schedule is read.
  size_t later = 0;
  while (!(st.rows[later].dp_rank == 1 && st.rows[later].step == 259)) ++later;

  SUBCASE("an op missing in one step") {
    Trace t = st;
    size_t i = later;
    TraceRow gone = t.rows[i];
    t.rows.erase(t.rows.begin() + static_cast<long>(i));
    t.lines.erase(t.lines.begin() + static_cast<long>(i));
    std::string err = error_of([&] { analyze(t, meta); });
    CHECK(err.find(path + ": " + std::string(optype_name(gone.optype)) + " " + std::to_string(gone.seq_id)) == 0);
    CHECK(err.find("is missing in step " + std::to_string(gone.step)) != std::string::npos);
  }
  SUBCASE("an op recorded twice") {
    Trace t = st;
    t.rows.push_back(t.rows[later]);
    t.lines.push_back(99999);
    std::string err = error_of([&] { analyze(t, meta); });
    CHECK(err.find(path + ":99999: column seq_id:") == 0);
    CHECK(err.find("appears twice") != std::string::npos);
  }
  SUBCASE("a dp_rank beyond the meta's dp_size") {
    Meta small = meta;
    small.dp = 1;
    std::string err = error_of([&] { analyze(st, small); });
    CHECK(err.find("column dp_rank: 1 >= dp_size 1") != std::string::npos);
  }
  SUBCASE("online, bad steps are dropped instead") {
    Trace t = st;
    int64_t step = t.rows[later].step;
    t.rows.erase(t.rows.begin() + static_cast<long>(later));
    t.lines.erase(t.lines.begin() + static_cast<long>(later));
    WhatIfOptions o;
    o.drop_bad_steps = true;
    WhatIfResult r = analyze(t, meta, o);
    CHECK(r.dropped_steps == std::vector<int64_t>{step});
    CHECK(r.steps.size() == 31);
  }
}

TEST_CASE("meta.yaml errors name the line and the key") {
  Scratch tmp("meta");
  std::string p1 = tmp.write("m1.yaml", "trial_name: x\ndp_size: two\n");
  CHECK(error_of([&] { read_meta(p1); }).find(p1 + ":2: key dp_size: 'two' is not a positive integer") == 0);
  std::string p2 = tmp.write("m2.yaml", "dp_size: 2\npp_size 4\n");
  CHECK(error_of([&] { read_meta(p2); }).find(p2 + ":3: not valid YAML: could not find expected ':'") == 0);
  std::string p3 = tmp.write("m3.yaml", "# comment\ndp_size: 2\npp_size: 4\nworld_size: 9\n");
  CHECK(error_of([&] { read_meta(p3); }).find("key world_size: 9 is not dp_size*pp_size*tp_size*dsp_size = 8") !=
        std::string::npos);
}

TEST_CASE("meta.yaml is YAML: a document marker, flow style, quotes and comments are read") {
  Scratch tmp("meta-yaml");
  const std::string block = tmp.write("block.yaml",
                                      "---\n# sizes\ntrial_name: 'run 7'  # quoted\ndp_size: \"4\"\n"
                                      "pp_size: 2\nrun_id: 0\nworld_size: 8\n...\n");
  Meta m = read_meta(block);
  CHECK(m.trial_name == "run 7");
  CHECK(m.dp == 4);
  CHECK(m.pp == 2);
  CHECK(m.world == 8);
  const std::string flow = tmp.write("flow.yaml", "{dp_size: 3, pp_size: 5, tp_size: 2}\n");
  m = read_meta(flow);
  CHECK(m.dp == 3);
  CHECK(m.pp == 5);
  CHECK(m.tp == 2);
  m = read_meta(tmp.write("empty.yaml", ""));
  CHECK(m.dp == 0);
  m = read_meta(tmp.write("comments.yaml", "# nothing yet\n"));
  CHECK(m.dp == 0);
}

TEST_CASE("meta.yaml: nested values, aliases, duplicate keys and a second document are refused with the line") {
  Scratch tmp("meta-refused");
  const std::string nested = tmp.write("nested.yaml", "dp_size: 4\nparallel:\n  pp_size: 2\n");
  CHECK(error_of([&] { read_meta(nested); }) ==
        nested + ":3: key parallel: expected a scalar value, got a mapping (meta.yaml is one flat mapping)");
  const std::string list = tmp.write("list.yaml", "dp_size: [4, 2]\n");
  CHECK(error_of([&] { read_meta(list); }).find(list + ":1: key dp_size: expected a scalar value, got a list") == 0);
  const std::string twice = tmp.write("twice.yaml", "dp_size: 4\npp_size: 2\ndp_size: 8\n");
  CHECK(error_of([&] { read_meta(twice); }) == twice + ":3: key dp_size: given twice");
  const std::string docs = tmp.write("docs.yaml", "dp_size: 4\n---\ndp_size: 8\n");
  CHECK(error_of([&] { read_meta(docs); }) == docs + ":2: a second YAML document: meta.yaml holds one");
  const std::string alias = tmp.write("alias.yaml", "a: &n 4\ndp_size: *n\n");
  CHECK(error_of([&] { read_meta(alias); }).find(alias + ":2: key dp_size: expected a scalar value, got an alias") ==
        0);
  const std::string scalar = tmp.write("scalar.yaml", "just text\n");
  CHECK(error_of([&] { read_meta(scalar); }) == scalar + ":1: expected a mapping of 'key: value', got a scalar");
  const std::string indented = tmp.write("indented.yaml", "dp_size: 4\n  pp_size: 2\n");  // one plain scalar
  CHECK(error_of([&] { read_meta(indented); }) ==
        indented + ":1: key dp_size: '4 pp_size' is not a positive integer up to 1048576");
  const std::string tab = tmp.write("tab.yaml", "dp_size: 4\n\tpp_size: 2\n");
  CHECK(error_of([&] { read_meta(tab); }) ==
        tab + ":2: not valid YAML: found a tab character that violates indentation (while scanning a plain scalar)");
}

TEST_CASE("a row whose dp_rank and stage would make a huge grid is refused, naming the line and column") {
  const std::string text =
      kHeader + "0,0,0,0,forward-compute,0,1,0,0,0,0\n" + "20000,20000,1,0,forward-compute,0,1,0,0,0,0\n";
  const std::string err = error_of([&] { parse_trace_csv(text, "big.csv"); });
  CHECK_MESSAGE(err.find("big.csv:3: column dp_rank: dp_rank up to 20000 and stage up to 20000") == 0, err);
}
