// straggler-loadgen — drives a real stragglerd over gRPC with R simulated
// ranks and measures what the daemon sustains (issue 6, item 2):
//
//   straggler-loadgen --ready-file /run/stragglerd.ready.json --ranks 1000
//                     --streams 8 --rate 100000 --batch 256 --duration 10
//   straggler-loadgen --daemon 127.0.0.1:7070 --daemon-pid 1234 --ranks 1000
//                     --find-saturation --json sat.json
//
// The ranks are split across S IngestService streams, as node agents would
// split them (stream k speaks for a contiguous block of ranks and says so in
// its hello). Each stream has its own channel and TCP connection, a writer
// thread and a reader thread. The writer sends ReportBatches of B reports at
// its share of --rate (0 = as fast as the window allows), keeping at most
// --window unacknowledged batches in flight; the reader takes the daemon's
// directives. Reports are valid, so the daemon accepts them: every rank
// reports iterations 0, 1, 2, ... in order (the stream cycles through its
// ranks row by row, so iteration rows complete and get judged), compute times
// are 100 ms +-5 %.
//
// Measured:
//  * accepted reports/s: the sum of Directive.accepted over the directives
//    read during the measured window, divided by the window;
//  * report-to-directive latency: from just before a batch is written to the
//    moment the directive acknowledging it (acked_sequence >= its sequence)
//    is read; p50/p99/max over every batch acknowledged in the window;
//  * daemon resident memory per rank: VmRSS of the daemon (from --daemon-pid,
//    or the pid in --ready-file) before any stream is opened and after the
//    run, difference / ranks. Meaningful for large --ranks only: a few MiB of
//    fixed cost (streams, gRPC buffers, allocator caches) are spread over R.
//
// --find-saturation runs steps of --step-duration seconds at rising offered
// rates (from --rate, default 50 000/s, times --step-factor each step, at
// most --max-steps), and stops when accepted/s stops growing (below 90 % of
// the offered rate and below 110 % of the best step so far) or p99 explodes
// (above 10x the first step's p99, and above 5 ms). The best accepted/s of
// any step is printed too (the saturation throughput). The knee is the last step
// that kept up with its offered rate and whose p99 had not exploded.
// A step whose reports the daemon rejected as rate_limited (its per-stream
// limits.stream_reports_per_second, 20 000/s by default) ends the search
// too, with that as the stop reason: past it the steps measure the limit,
// not the daemon, so such runs need a daemon with the limit off.
//
// --soak-minutes M runs M minutes at --rate in consecutive samples of
// --soak-interval seconds (default 60): after each one it prints the daemon's
// VmRSS, accepted reports/s and p99, so memory that grows with time (not with
// ranks) shows as a rising column; --json gets the samples and the growth
// from the first sample to the last (BENCHMARKS.md "Soak").
//
// Loopback only: --daemon must be 127.0.0.0/8, localhost, [::1] or unix:.
// Every loop is bounded in time (a call deadline covers the whole run; every
// wait has a timeout) and in count (steps, batches per step).
//
// Exit status: 0 ok (and at least one report accepted); 1 the daemon failed,
// rejected reports, or accepted none; 2 bad flags.
//
// The pieces: loadgen.h.
#include <optional>

#include "loadgen.h"

int main(int argc, char** argv) {
  straggler::loadgen::Options o;
  if (std::optional<int> exit = straggler::loadgen::ParseFlags(argc, argv, o)) return *exit;
  return straggler::loadgen::Run(std::move(o));
}
