// CSV traces and scenario YAML: parsing, errors that name the line and the
// value, generation and ground truth.
#include <catch2/catch.hpp>

#include <cmath>
#include <sstream>

#include "straggler/quality/csv_trace.h"
#include "straggler/quality/scenario.h"

using namespace straggler::quality;

namespace {
absl::StatusOr<Trace> Csv(const std::string& text) {
  std::istringstream in(text);
  return ParseCsvTrace(in, "t.csv");
}
// The error of a CSV trace the parser must refuse.
std::string CsvError(const std::string& text) {
  auto t = Csv(text);
  REQUIRE_FALSE(t.ok());
  return std::string(t.status().message());
}
bool Has(const std::string& message, const std::string& needle) {
  return message.find(needle) != std::string::npos;
}
bool Has(const absl::Status& s, const std::string& needle) {
  return Has(std::string(s.message()), needle);
}
}  // namespace

TEST_CASE("csv: good file, any column order, optional epoch, extra columns ignored") {
  auto t = Csv(
      "# exported by stragglerctl\n"
      "rank,compute_seconds,host,iteration,epoch\r\n"
      "0,0.10,a,10,1\n"
      "1,0.30,b,10,1\n"
      "\n"
      "0,0.11,a,11,1\n"
      "1,0.12,b,12,2\n");
  REQUIRE(t.ok());
  CHECK(t->ranks == 2);
  CHECK(t->first_iteration == 10);
  CHECK(t->iterations == 3);
  CHECK(t->At(0, 1) == Approx(0.30));
  CHECK(t->At(1, 0) == Approx(0.11));
  CHECK_FALSE(t->Reported(1, 1));  // rank 1 skipped iteration 11
  CHECK(t->epoch == std::vector<uint64_t>{1, 1, 2});
  CHECK(t->base_seconds == Approx(0.12));  // median of 0.10 0.11 0.12 0.30 (upper middle)
  CHECK_FALSE(t->has_truth);
}

TEST_CASE("csv: without an epoch column every iteration is epoch 0") {
  auto t = Csv("iteration,rank,compute_seconds\n0,0,1\n1,0,1\n");
  REQUIRE(t.ok());
  CHECK(t->epoch == std::vector<uint64_t>{0, 0});
}

TEST_CASE("csv: missing column names it") {
  auto t = Csv("iteration,rank,seconds\n0,0,1\n");
  REQUIRE_FALSE(t.ok());
  CHECK(Has(t.status(), "t.csv:1"));
  CHECK(Has(t.status(), "compute_seconds"));
}

TEST_CASE("csv: bad number names the line and the value") {
  auto t = Csv("iteration,rank,compute_seconds\n0,0,0.1\n1,0,abc\n");
  REQUIRE_FALSE(t.ok());
  CHECK(Has(t.status(), "t.csv:3"));
  CHECK(Has(t.status(), "'abc'"));
  const std::string neg = CsvError("iteration,rank,compute_seconds\n0,0,-1\n");
  CHECK(Has(neg, "'-1'"));
  auto rank = Csv("iteration,rank,compute_seconds\n0,x,1\n");
  REQUIRE_FALSE(rank.ok());
  CHECK(Has(rank.status(), "rank 'x'"));
}

TEST_CASE("csv: the world is at most 65536 ranks, a larger rank id names the rank and line") {
  // The world is 0 .. the highest rank: a stray id must not size it.
  auto top = Csv("iteration,rank,compute_seconds\n0,0,0.1\n0,65535,0.1\n");
  REQUIRE(top.ok());
  CHECK(top->ranks == 65536);
  const std::string sparse = CsvError("iteration,rank,compute_seconds\n0,0,0.1\n1,999999,0.1\n");
  CHECK(Has(sparse, "t.csv:3"));
  CHECK(Has(sparse, "rank '999999'"));
  CHECK(Has(sparse, "65536"));
  CHECK(Has(Csv("iteration,rank,compute_seconds\n0,65536,0.1\n").status(), "rank '65536'"));
}

TEST_CASE("csv: wrong field count, duplicates and contradicting epochs are errors") {
  CHECK(Has(Csv("iteration,rank,compute_seconds\n0,0\n").status(), "t.csv:2"));
  const std::string dup = CsvError("iteration,rank,compute_seconds\n0,0,1\n0,0,2\n");
  CHECK(Has(dup, "t.csv:3"));
  CHECK(Has(dup, "already given at line 2"));
  const std::string ep = CsvError("iteration,rank,compute_seconds,epoch\n0,0,1,0\n0,1,1,1\n");
  CHECK(Has(ep, "t.csv:3"));
  CHECK_FALSE(Csv("").ok());
  CHECK_FALSE(Csv("iteration,rank,compute_seconds\n").ok());
}

namespace {
const char* kBase = R"(name: t
ranks: 4
iterations: 40
iterations_per_epoch: 10
base_seconds: 1.0
noise: 0.0
seed: 7
)";
Scenario Must(const std::string& effects) {
  auto s = ParseScenario(std::string(kBase) + effects, "t.yaml");
  INFO(s.status().message());
  REQUIRE(s.ok());
  return *s;
}
}  // namespace

TEST_CASE("scenario: noiseless slow effect gives exact times and truth") {
  const Scenario s = Must("effects:\n  - {type: slow, rank: 1, factor: 3, from: 10, to: 20}\n");
  const Trace t = Generate(s);
  CHECK(t.At(9, 1) == 1.0);
  CHECK(t.At(10, 1) == 3.0);
  CHECK(t.At(19, 1) == 3.0);
  CHECK(t.At(20, 1) == 1.0);
  CHECK(t.epoch[25] == 2);
  CHECK(Intervals(t.truth) == std::vector<Interval>{{1, 10, 20}});
}

TEST_CASE("scenario: below truth_min_factor is not a straggler, the factor is configurable") {
  CHECK(Generate(Must("effects:\n  - {type: slow, rank: 0, factor: 1.2}\n")).truth.Count() == 0);
  auto s = ParseScenario(std::string(kBase) + "truth_min_factor: 1.2\n" +
                             "effects:\n  - {type: slow, rank: 0, factor: 1.2}\n",
                         "t.yaml");
  REQUIRE(s.ok());
  CHECK(Generate(*s).truth.Count() == 40);
}

TEST_CASE("scenario: K/N pattern - short period averaged, long period per step") {
  // 4/5 at 3x: mean (4*3 + 1)/5 = 2.6 >= 1.5 -> the whole interval.
  const Trace a = Generate(Must("effects:\n  - {type: slow, rank: 0, factor: 3, pattern: 4/5}\n"));
  CHECK(a.At(0, 0) == 3.0);
  CHECK(a.At(4, 0) == 1.0);
  CHECK(a.truth.Count() == 40);
  // 1/5 at 3x: mean 1.4 < 1.5 -> never.
  CHECK(Generate(Must("effects:\n  - {type: slow, rank: 0, factor: 3, pattern: 1/5}\n"))
            .truth.Count() == 0);
  // 10/20 (period > 10): only the slow steps.
  const Trace b = Generate(Must("effects:\n  - {type: slow, rank: 0, factor: 3, pattern: 10/20}\n"));
  CHECK(Intervals(b.truth) == std::vector<Interval>{{0, 0, 10}, {0, 20, 30}});
  // explicit truth: steps on a short period
  const Trace c = Generate(
      Must("effects:\n  - {type: slow, rank: 0, factor: 3, pattern: 1/2, truth: steps}\n"));
  CHECK(c.truth.Count() == 20);
}

TEST_CASE("scenario: ramp truth starts where the factor reaches 1.5, holds, then ends") {
  // 1.0 -> 3.0 over [0, 20): factor 1 + 2*i/20 >= 1.5 from i = 5; held to 30.
  const Trace t = Generate(Must(
      "effects:\n  - {type: ramp, rank: 2, from: 0, to: 20, start_factor: 1.0, end_factor: 3.0, "
      "hold_until: 30}\n"));
  CHECK(Intervals(t.truth) == std::vector<Interval>{{2, 5, 30}});
  CHECK(t.At(10, 2) == Approx(2.0));
  CHECK(t.At(25, 2) == Approx(3.0));
  CHECK(t.At(30, 2) == Approx(1.0));
}

TEST_CASE("scenario: global and generation effects slow ranks but are not stragglers") {
  const Trace t = Generate(Must(
      "effects:\n  - {type: global, factor: 2, from: 5, to: 10}\n"
      "  - {type: generation, ranks: [\"2-3\"], factor: 2}\n"));
  CHECK(t.At(0, 0) == 1.0);
  CHECK(t.At(0, 3) == 2.0);
  CHECK(t.At(5, 0) == 2.0);
  CHECK(t.At(5, 3) == 4.0);
  CHECK(t.truth.Count() == 0);
}

TEST_CASE("scenario: a silent rank has no reports and no truth from `from` on") {
  const Trace t = Generate(Must(
      "effects:\n  - {type: slow, rank: 1, factor: 3}\n  - {type: silent, rank: 1, from: 30}\n"));
  CHECK(t.Reported(29, 1));
  CHECK_FALSE(t.Reported(30, 1));
  CHECK(Intervals(t.truth) == std::vector<Interval>{{1, 0, 30}});
}

TEST_CASE("scenario: generation is deterministic from the seed") {
  const std::string noisy =
      "name: n\nranks: 3\niterations: 50\nbase_seconds: 0.5\nnoise: 0.1\nseed: 42\n"
      "effects:\n  - {type: spike, ranks: all, factor: 3, probability: 0.1}\n";
  auto a = ParseScenario(noisy, "a.yaml"), b = ParseScenario(noisy, "b.yaml");
  REQUIRE(a.ok());
  const Trace ta = Generate(*a), tb = Generate(*b);
  CHECK(ta.compute == tb.compute);
  auto c = ParseScenario(noisy.substr(0, noisy.find("seed: 42")) + "seed: 43\n", "c.yaml");
  REQUIRE(c.ok());
  CHECK(Generate(*c).compute != ta.compute);
  // Same seed, same first value on every platform (own RNG, no std:: distribution).
  uint64_t st = 1;
  CHECK(SplitMix64(st) == 0x910a2dec89025cc1ULL);
}

TEST_CASE("scenario: errors name the file, line and key") {
  auto unknown = ParseScenario(std::string(kBase) + "colour: red\n", "t.yaml");
  REQUIRE_FALSE(unknown.ok());
  CHECK(Has(unknown.status(), "t.yaml:8"));
  CHECK(Has(unknown.status(), "'colour'"));
  auto bad_rank = ParseScenario(std::string(kBase) + "effects:\n  - {type: slow, rank: 9, factor: 2}\n",
                                "t.yaml");
  REQUIRE_FALSE(bad_rank.ok());
  CHECK(Has(bad_rank.status(), "out of range"));
  auto bad_type = ParseScenario(std::string(kBase) + "effects:\n  - {type: slowish, rank: 1}\n",
                                "t.yaml");
  CHECK(Has(bad_type.status(), "slowish"));
  auto bad_pattern = ParseScenario(
      std::string(kBase) + "effects:\n  - {type: slow, rank: 1, factor: 2, pattern: 6/5}\n", "t.yaml");
  CHECK(Has(bad_pattern.status(), "6/5"));
  auto missing = ParseScenario("name: x\nranks: 4\n", "t.yaml");
  CHECK(Has(missing.status(), "missing `iterations`"));
}

TEST_CASE("scenario: range errors name the value given") {
  auto with = [](const std::string& from, const std::string& to) {
    std::string text = kBase;
    const size_t at = text.find(from);
    REQUIRE(at != std::string::npos);
    return ParseScenario(text.replace(at, from.size(), to), "t.yaml");
  };
  CHECK(Has(with("base_seconds: 1.0", "base_seconds: -0.1").status(),
            "t.yaml:5: base_seconds=-0.1 must be > 0"));
  CHECK(Has(with("noise: 0.0", "noise: 1.5").status(), "noise=1.5 must be in [0, 1]"));
  CHECK(Has(ParseScenario(std::string(kBase) + "truth_min_factor: 0.9\n", "t.yaml").status(),
            "truth_min_factor=0.9 must be > 1"));
  auto effect = [](const std::string& e) {
    return ParseScenario(std::string(kBase) + "effects:\n  - " + e + "\n", "t.yaml").status();
  };
  CHECK(Has(effect("{type: slow, rank: 1, factor: -2}"), "effects[0].factor=-2 must be > 0"));
  CHECK(Has(effect("{type: spike, rank: 1, factor: 2, probability: 1.5}"),
            "effects[0].probability=1.5 must be in [0, 1]"));
  CHECK(Has(effect("{type: ramp, rank: 1, from: 1, to: 5, start_factor: 0, end_factor: 2}"),
            "effects[0].start_factor=0 must be > 0"));
  CHECK(Has(effect("{type: ramp, rank: 1, from: 1, to: 5, end_factor: -1}"),
            "effects[0].end_factor=-1 must be > 0"));
}

TEST_CASE("csv: topology: optional peer_group and replica columns, one topology per rank") {
  auto t = Csv(
      "iteration,rank,compute_seconds,peer_group,replica\n"
      "0,0,0.10,stage0,0\n"
      "0,1,0.16,stage1,0\n"
      "0,2,0.10,,\n"
      "1,0,0.10,stage0,0\n"
      "1,1,0.16,stage1,0\n");
  REQUIRE(t.ok());
  CHECK(t->peer_group == std::vector<std::string>{"stage0", "stage1", ""});
  REQUIRE(t->replica.size() == 3);
  CHECK(t->replica[1] == 0u);
  CHECK_FALSE(t->replica[2]);  // an empty cell: not declared
  // Without the columns nothing is declared.
  CHECK(Csv("iteration,rank,compute_seconds\n0,0,1\n")->peer_group.empty());

  const std::string changed = CsvError("iteration,rank,compute_seconds,peer_group\n0,0,1,stage0\n1,0,1,stage1\n");
  CHECK(Has(changed, "t.csv:3: rank 0 changes its topology (peer_group 'stage1'"));
  const std::string bad = CsvError("iteration,rank,compute_seconds,peer_group\n0,0,1,stage 0\n");
  CHECK(Has(bad, "t.csv:2: peer_group 'stage 0' is not"));
  const std::string far = CsvError("iteration,rank,compute_seconds,replica\n0,0,1,2\n0,1,1,0\n");
  CHECK(Has(far, "replica 2 of rank 0 is not below the trace's 2 ranks"));
  const std::string word = CsvError("iteration,rank,compute_seconds,replica\n0,0,1,one\n");
  CHECK(Has(word, "replica 'one' is not a non-negative integer"));
}

TEST_CASE("csv: topology: an optional gpu_model column, one model per rank") {
  auto t = Csv(
      "iteration,rank,compute_seconds,gpu_model\n"
      "0,0,0.10,H100\n"
      "0,1,0.18,A100\n"
      "1,0,0.10,H100\n");
  REQUIRE(t.ok());
  CHECK(t->gpu_model == std::vector<std::string>{"H100", "A100"});
  CHECK(t->peer_group == std::vector<std::string>{"", ""});
  CHECK(Csv("iteration,rank,compute_seconds,peer_group\n0,0,1,a\n")->gpu_model.empty());
  const std::string changed = CsvError("iteration,rank,compute_seconds,gpu_model\n0,0,1,H100\n1,0,1,A100\n");
  CHECK(Has(changed, "t.csv:3: rank 0 changes its topology"));
  CHECK(Has(changed, "gpu_model 'A100'"));
}

TEST_CASE("csv: optional work, input_wait_seconds and optimizer_seconds columns") {
  // Without the columns a file reads exactly as before: no vectors.
  auto plain = Csv("iteration,rank,compute_seconds\n0,0,0.1\n0,1,0.2\n");
  REQUIRE(plain.ok());
  CHECK(plain->work.empty());
  CHECK(plain->input_wait.empty());
  CHECK(plain->optimizer.empty());

  // With them: per report, an empty cell = not given; any column order.
  auto t = Csv(
      "optimizer_seconds,iteration,rank,compute_seconds,work,input_wait_seconds\n"
      "0.02,0,0,0.10,4096,0.005\n"
      ",0,1,0.20,8192,\n"
      "0.03,1,1,0.21,,0\n");
  REQUIRE(t.ok());
  REQUIRE(t->work.size() == t->compute.size());
  REQUIRE(t->input_wait.size() == t->compute.size());
  REQUIRE(t->optimizer.size() == t->compute.size());
  auto cell = [&](const std::vector<double>& v, uint64_t row, uint32_t rank) {
    return v[static_cast<size_t>(row) * t->ranks + rank];
  };
  CHECK(cell(t->work, 0, 0) == 4096);
  CHECK(cell(t->work, 0, 1) == 8192);
  CHECK(std::isnan(cell(t->work, 1, 1)));        // empty cell
  CHECK(std::isnan(cell(t->work, 1, 0)));        // no report at all
  CHECK(cell(t->input_wait, 0, 0) == 0.005);
  CHECK(std::isnan(cell(t->input_wait, 0, 1)));
  CHECK(cell(t->input_wait, 1, 1) == 0);
  CHECK(cell(t->optimizer, 0, 0) == 0.02);
  CHECK(std::isnan(cell(t->optimizer, 0, 1)));
  CHECK(cell(t->optimizer, 1, 1) == 0.03);
  CHECK(t->At(1, 1) == Approx(0.21));  // compute as before

  // One column alone makes only its vector.
  auto only_work = Csv("iteration,rank,compute_seconds,work\n0,0,0.1,3\n");
  REQUIRE(only_work.ok());
  CHECK(only_work->work == std::vector<double>{3});
  CHECK(only_work->input_wait.empty());
  CHECK(only_work->run_delay.empty());

  // The process's run delay (host telemetry), the same way.
  auto delays = Csv("iteration,rank,compute_seconds,run_delay_seconds_per_second\n"
                    "0,0,0.1,0.005\n0,1,0.2,\n");
  REQUIRE(delays.ok());
  REQUIRE(delays->run_delay.size() == delays->compute.size());
  CHECK(delays->run_delay[0] == 0.005);
  CHECK(std::isnan(delays->run_delay[1]));
  CHECK(CsvError("iteration,rank,compute_seconds,run_delay_seconds_per_second\n0,0,0.1,-1\n") ==
        "t.csv:2: run_delay_seconds_per_second '-1' is not a finite number >= 0");
}

TEST_CASE("csv: a bad work or phase names the line, the column and the value") {
  CHECK(CsvError("iteration,rank,compute_seconds,work\n0,0,0.1,0\n") ==
        "t.csv:2: work '0' is not a finite number > 0");
  CHECK(CsvError("iteration,rank,compute_seconds,work\n0,0,0.1,-3\n") ==
        "t.csv:2: work '-3' is not a finite number > 0");
  CHECK(CsvError("iteration,rank,compute_seconds,work\n0,0,0.1,many\n") ==
        "t.csv:2: work 'many' is not a finite number > 0");
  CHECK(CsvError("iteration,rank,compute_seconds,input_wait_seconds\n0,0,0.1,0\n0,1,0.1,-0.5\n") ==
        "t.csv:3: input_wait_seconds '-0.5' is not a finite number >= 0");
  CHECK(CsvError("iteration,rank,compute_seconds,optimizer_seconds\n0,0,0.1,inf\n") ==
        "t.csv:2: optimizer_seconds 'inf' is not a finite number >= 0");
  CHECK(CsvError("iteration,rank,compute_seconds,optimizer_seconds\n0,0,0.1,nan\n") ==
        "t.csv:2: optimizer_seconds 'nan' is not a finite number >= 0");
  CHECK(Has(CsvError("iteration,rank,compute_seconds,work,WORK\n0,0,0.1,1,1\n"),
            "column 'work' appears twice"));
}

TEST_CASE("scenario: a work model varies each step with its work and reports it") {
  // No noise, no effects: every step's time is base x (0.2 + 0.8 x cost /
  // mean cost), so time over (0.2 + 0.8 cost/mean) is the same everywhere.
  const Scenario s = Must(
      "work: {sequences: 4, sigma: 0.6, attention: 1.0, overhead: 0.2, report: cost}\n"
      "effects: []\n");
  const Trace t = Generate(s);
  REQUIRE(t.work.size() == t.compute.size());
  double lo = 1e9, hi = 0;
  for (size_t i = 0; i < t.compute.size(); ++i) {
    lo = std::min(lo, t.compute[i]);
    hi = std::max(hi, t.compute[i]);
  }
  CHECK(hi / lo > 1.5);  // the work moves the times
  // Steps of more work take longer: time is increasing in the reported cost.
  for (size_t i = 0; i < t.compute.size(); ++i)
    for (size_t j = 0; j < t.compute.size(); ++j)
      if (t.work[i] > t.work[j]) CHECK(t.compute[i] > t.compute[j]);
  // Without a work model the times are what they were (no draw added).
  const Trace plain = Generate(Must("effects: []\n"));
  CHECK(plain.work.empty());
  for (double c : plain.compute) CHECK(c == 1.0);
  // report: none: the same times, no work in the trace.
  const Trace hidden = Generate(Must(
      "work: {sequences: 4, sigma: 0.6, attention: 1.0, overhead: 0.2, report: none}\n"
      "effects: []\n"));
  CHECK(hidden.work.empty());
  CHECK(hidden.compute == t.compute);
  // report: tokens: a unit that misses the attention term.
  const Trace tokens = Generate(Must(
      "work: {sequences: 4, sigma: 0.6, attention: 1.0, overhead: 0.2, report: tokens}\n"
      "effects: []\n"));
  CHECK(tokens.compute == t.compute);
  CHECK(tokens.work != t.work);
}

TEST_CASE("scenario: work model errors name the key and the value") {
  auto err = [](const std::string& work) {
    auto s = ParseScenario(std::string(kBase) + work + "effects: []\n", "t.yaml");
    REQUIRE_FALSE(s.ok());
    return std::string(s.status().message());
  };
  CHECK(Has(err("work: {report: bytes}\n"), "work.report='bytes' must be cost, tokens or none"));
  CHECK(Has(err("work: {overhead: 1}\n"), "work.overhead=1 must be in [0, 1)"));
  CHECK(Has(err("work: {sequences: 0}\n"), "work.sequences=0 must be in [1, 4096]"));
  CHECK(Has(err("work: {size: 3}\n"), "unknown key 'size' in work"));
}

TEST_CASE("scenario: an input model splits the own time, phase: input slows the input wait") {
  // No noise: compute 0.95 and input wait 0.05 of base_seconds everywhere;
  // rank 1's input wait x21 on [10, 20): its own time 0.95 + 1.05 = 2x,
  // compute unchanged, a straggler of truth factor 2.
  const Scenario s = Must(
      "input: {share: 0.05, noise: 0}\n"
      "effects:\n  - {type: slow, rank: 1, factor: 21, from: 10, to: 20, phase: input}\n");
  const Trace t = Generate(s);
  REQUIRE(t.input_wait.size() == t.compute.size());
  auto at = [&](const std::vector<double>& v, uint64_t row, uint32_t r) {
    return v[static_cast<size_t>(row) * t.ranks + r];
  };
  CHECK(at(t.compute, 5, 1) == Approx(0.95));
  CHECK(at(t.input_wait, 5, 1) == Approx(0.05));
  CHECK(at(t.compute, 12, 1) == Approx(0.95));
  CHECK(at(t.input_wait, 12, 1) == Approx(1.05));
  CHECK(t.TruthFactorAt(12, 1) == Approx(2.0f));
  CHECK(t.truth.at(1, 12));
  CHECK_FALSE(t.truth.at(1, 5));
  CHECK_FALSE(t.truth.at(0, 12));
  // A compute effect beside it scales the compute part only.
  const Trace both = Generate(Must(
      "input: {share: 0.05, noise: 0}\n"
      "effects:\n  - {type: slow, rank: 2, factor: 2, from: 10, to: 20}\n"));
  CHECK(at(both.compute, 12, 2) == Approx(1.9));
  CHECK(at(both.input_wait, 12, 2) == Approx(0.05));
  CHECK(both.TruthFactorAt(12, 2) == Approx(1.95f));
  // Input stalls on every rank: spikes of the input wait, never truth.
  const Trace stalls = Generate(Must(
      "input: {share: 0.05, noise: 0}\n"
      "effects:\n  - {type: spike, ranks: all, factor: 40, every: 7, phase: input}\n"));
  CHECK(at(stalls.input_wait, 7, 3) == Approx(2.0));
  CHECK(at(stalls.compute, 7, 3) == Approx(0.95));
  CHECK(stalls.truth.Count() == 0);
  // Without an input model: no input wait, and the times are what they were.
  const Trace plain = Generate(Must("effects: []\n"));
  CHECK(plain.input_wait.empty());
  for (double c : plain.compute) CHECK(c == 1.0);
  // `cause` travels to the trace for the criteria (CheckCauses).
  CHECK(Generate(Must("input: {}\ncause: input_pipeline\neffects: []\n")).expected_cause ==
        "input_pipeline");
}

TEST_CASE("scenario: input and host models, phase and cause errors name the key and the value") {
  auto err = [](const std::string& rest) {
    auto s = ParseScenario(std::string(kBase) + rest, "t.yaml");
    REQUIRE_FALSE(s.ok());
    return std::string(s.status().message());
  };
  CHECK(Has(err("input: {share: 1}\neffects: []\n"), "input.share=1 must be in (0, 1)"));
  CHECK(Has(err("input: {noise: -1}\neffects: []\n"), "input.noise=-1 must be in [0, 1]"));
  CHECK(Has(err("input: {size: 3}\neffects: []\n"), "unknown key 'size' in input"));
  CHECK(Has(err("effects:\n  - {type: slow, rank: 1, factor: 2, phase: input}\n"),
            "effects[0].phase=input needs the scenario's `input:`"));
  CHECK(Has(err("input: {}\neffects:\n  - {type: slow, rank: 1, factor: 2, phase: disk}\n"),
            "effects[0].phase=disk is not compute, input or host"));
  CHECK(Has(err("effects:\n  - {type: slow, rank: 1, factor: 2, phase: host}\n"),
            "effects[0].phase=host needs the scenario's `host:`"));
  CHECK(Has(err("host: {run_delay: 1}\neffects: []\n"), "host.run_delay=1 must be in [0, 1)"));
  CHECK(Has(err("host: {steal: 0.1}\neffects: []\n"), "unknown key 'steal' in host (run_delay)"));
  CHECK(Has(err("input: {}\neffects:\n  - {type: global, factor: 2, phase: input}\n"),
            "unknown key 'phase' in effects[0] (global)"));
  CHECK(Has(err("cause: thermal\neffects: []\n"),
            "cause=thermal is not input_pipeline, compute, host or none_visible"));
}

TEST_CASE("scenario: host contention slows the compute and shows in the run delay") {
  // Rank 1 at 2x over [10, 20) with `phase: host`: its compute doubles and its
  // process's run delay is the model's 0.01 + (1 - 1/2) s/s; the others keep 0.01.
  auto s = ParseScenario(std::string(kBase) +
                             "host: {run_delay: 0.01}\neffects:\n"
                             "  - {type: slow, rank: 1, factor: 2, from: 10, to: 20, phase: host}\n",
                         "t.yaml");
  REQUIRE(s.ok());
  const Trace t = Generate(*s);
  REQUIRE(t.run_delay.size() == t.compute.size());
  auto delay = [&](uint64_t row, uint32_t r) { return t.run_delay[row * t.ranks + r]; };
  CHECK(delay(5, 1) == Approx(0.01));
  CHECK(delay(15, 1) == Approx(0.51));
  CHECK(delay(15, 0) == Approx(0.01));
  CHECK(t.At(15, 1) > 1.5 * t.At(15, 0));
  // Without `host:` the trace has no run delay.
  auto plain = ParseScenario(std::string(kBase) + "effects: []\n", "t.yaml");
  REQUIRE(plain.ok());
  CHECK(Generate(*plain).run_delay.empty());
}
