// Protobuf ReportBatch encode and decode for batches of 1, 64 and 1024
// reports (issue 6, item 1). The reports are filled as the client library
// fills them (rank, epoch, iteration, compute_seconds, step_seconds,
// collective_wait_seconds, start_unix_nanos). Messages and the output string are
// reused across iterations, as the client's sender and the daemon's reactor
// reuse theirs.
//
//   proto_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>

#include "straggler/v1/straggler.pb.h"

namespace {

namespace v1 = straggler::v1;

void Fill(v1::ReportBatch* batch, int n) {
  batch->Clear();
  batch->set_sequence(12345);
  const int64_t t0 = 1'700'000'000'000'000'000;
  for (int i = 0; i < n; ++i) {
    v1::IterationReport* r = batch->add_reports();
    r->set_rank(static_cast<uint32_t>(i));
    r->set_epoch(3);
    r->set_iteration(100000 + static_cast<uint64_t>(i));
    r->set_compute_seconds(0.1 + 1e-5 * i);
    r->set_step_seconds(0.12 + 1e-5 * i);
    r->set_collective_wait_seconds(0.02);
    const int64_t ns = t0 + int64_t{1000} * i;
    r->set_start_unix_nanos(static_cast<uint64_t>(ns));
  }
}

// Build + serialize: what the client's sender does per batch.
void BM_ReportBatchEncode(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  v1::ReportBatch batch;
  std::string out;
  for (auto _ : state) {
    Fill(&batch, n);
    batch.SerializeToString(&out);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(out.size()));
  state.counters["bytes_per_batch"] = static_cast<double>(out.size());
}

// Serialize only, of an already built batch.
void BM_ReportBatchSerialize(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  v1::ReportBatch batch;
  Fill(&batch, n);
  std::string out;
  for (auto _ : state) {
    batch.SerializeToString(&out);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(out.size()));
}

// Parse: what the daemon does per batch before ingesting it.
void BM_ReportBatchDecode(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  v1::ReportBatch batch;
  Fill(&batch, n);
  const std::string wire = batch.SerializeAsString();
  v1::ReportBatch parsed;
  for (auto _ : state) {
    if (!parsed.ParseFromString(wire)) {
      state.SkipWithError("parse failed");
      break;
    }
    benchmark::DoNotOptimize(parsed.reports_size());
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(wire.size()));
}

BENCHMARK(BM_ReportBatchEncode)->Arg(1)->Arg(64)->Arg(1024);
BENCHMARK(BM_ReportBatchSerialize)->Arg(1)->Arg(64)->Arg(1024);
BENCHMARK(BM_ReportBatchDecode)->Arg(1)->Arg(64)->Arg(1024);

}  // namespace

BENCHMARK_MAIN();
