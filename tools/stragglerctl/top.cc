#include "top.h"

#include <time.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <map>
#include <sstream>

#include "render.h"

namespace stragglerctl {
namespace v1 = straggler::v1;

namespace {

std::string Ratio(double r) {
  if (r <= 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fx", r);
  return buf;
}

}  // namespace

std::string RenderTop(const v1::Job& job, const v1::ListWorkersResponse& workers,
                      const std::vector<v1::Event>& newest_events) {
  std::ostringstream out;
  const v1::Membership& m = job.membership();
  out << "job " << job.job_id() << (job.run_id().empty() ? "" : " run " + job.run_id())
      << (job.finished() ? " (finished)" : "") << "  iteration " << job.highest_iteration()
      << "  step " << Millis(job.step_seconds()) << "  baseline " << Millis(job.baseline_seconds())
      << "\nmembership v" << m.version() << " from iteration " << m.effective_iteration() << ": "
      << ExcludedList(m) << "  (" << job.active_ranks() << "/" << job.world_size()
      << " active, " << job.straggler_ranks() << " straggler, " << job.mild_ranks() << " mild, "
      << job.unresponsive_ranks()
      << " unresponsive)\n\n";
  std::map<uint32_t, const v1::ExcludedRank*> excluded;
  for (const v1::ExcludedRank& x : m.excluded()) excluded[x.rank()] = &x;
  Table t({"RANK", "NODE", "STATE", "COUNTER", "RATIO", "LAST", "ITERATION", "REASON"},
          {Align::kRight, Align::kLeft, Align::kLeft, Align::kRight, Align::kRight, Align::kRight,
           Align::kRight, Align::kLeft});
  for (const v1::Worker& w : workers.workers()) {
    auto x = excluded.find(w.rank());
    std::string state = x != excluded.end() ? "excluded" : StateName(w.state());
    std::string reason;
    if (x != excluded.end()) {
      reason = ReasonName(x->second->reason());
      if (!x->second->detail().empty()) reason += ": " + x->second->detail();
    }
    if (w.monitor_only()) reason += (reason.empty() ? "" : "; ") + std::string("monitoring only");
    if (w.override() == v1::RANK_OVERRIDE_FORCE_EXCLUDE ||
        w.override() == v1::RANK_OVERRIDE_FORCE_INCLUDE) {
      reason += (reason.empty() ? "" : "; ") + std::string("override ") + OverrideName(w.override());
    }
    // The terminal must not obey what a client wrote: control bytes become '?'.
    for (char& c : reason) if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
    t.AddRow({std::to_string(w.rank()), w.node().empty() ? "-" : w.node(), state,
              std::to_string(w.counter()) + "/" + std::to_string(w.limit()),
              Ratio(w.slowdown_ratio()), Millis(w.last_compute_seconds()),
              std::to_string(w.last_iteration()), reason.empty() ? "-" : reason});
  }
  t.Print(out);
  out << "\nlast events:\n";
  if (newest_events.empty()) out << "  (none)\n";
  for (const v1::Event& e : newest_events) {
    std::ostringstream line;
    PrintEventLine(e, line);
    std::string text = line.str();
    for (char& c : text) if ((static_cast<unsigned char>(c) < 0x20 && c != '\n') || c == 0x7f) c = '?';
    out << "  " << text;
  }
  return out.str();
}

int RunTop(v1::QueryService::Stub& query, const TopOptions& options,
           const std::function<void(grpc::ClientContext&)>& prepare, const sigset_t& signals,
           std::ostream& out, const std::function<int(const grpc::Status&)>& on_error) {
  std::deque<v1::Event> newest;
  uint64_t since = 0;
  for (;;) {
    v1::Job job;
    v1::ListWorkersResponse workers;
    {
      grpc::ClientContext ctx;
      prepare(ctx);
      v1::GetJobRequest req;
      req.set_job_id(options.job);
      if (grpc::Status s = query.GetJob(&ctx, req, &job); !s.ok()) return on_error(s);
    }
    {
      grpc::ClientContext ctx;
      prepare(ctx);
      v1::ListWorkersRequest req;
      req.set_job_id(options.job);
      if (grpc::Status s = query.ListWorkers(&ctx, req, &workers); !s.ok()) return on_error(s);
    }
    // Only the new events: a long job's history is read once, page by page.
    for (;;) {
      grpc::ClientContext ctx;
      prepare(ctx);
      v1::ListEventsRequest req;
      req.set_job_id(options.job);
      req.set_since_sequence(since);
      v1::ListEventsResponse events;
      if (grpc::Status s = query.ListEvents(&ctx, req, &events); !s.ok()) return on_error(s);
      for (const v1::Event& e : events.events()) {
        newest.push_back(e);
        if (newest.size() > static_cast<size_t>(options.events)) newest.pop_front();
      }
      since = std::max(since, events.last_sequence());
      if (events.events_size() < 1000) break;  // the daemon's default page: more wait
    }
    if (options.clear_screen) out << "\x1b[H\x1b[2J";
    out << RenderTop(job, workers, std::vector<v1::Event>(newest.begin(), newest.end()))
        << "\n(refreshing every " << options.interval_ms << " ms; Ctrl-C quits)\n";
    out.flush();
    const timespec wait{options.interval_ms / 1000, (options.interval_ms % 1000) * 1000L * 1000L};
    if (sigtimedwait(&signals, nullptr, &wait) > 0) {
      out << '\n';
      out.flush();
      return 0;
    }
  }
}

}  // namespace stragglerctl
