// stragglerd web console (docs/console.md). Reads the /v1 REST API only.
//
// Safety rules of this file:
//  - Every value from the daemon reaches the page as a text node or a
//    property (textContent, title, value), never a string parsed as HTML,
//    so a reason or node name holding HTML shows as text.
//  - The token lives in one variable of this closure: never in storage,
//    cookies, the URL or the console log; a reload forgets it.
"use strict";
(() => {
  const POLL_MS = 2000;
  const HEATMAP_ITERATIONS = 60;  // columns of the rank heatmap
  const EVENTS_SHOWN = 100;
  const THROUGHPUT_WINDOW = 20;   // iterations each side of an exclusion
  // Iterations after a switch before its step-time change is shown: the first
  // ones after it can still carry the old set's wait (a rank that learned the
  // version late puts the switch off), so one or two would mislead.
  const THROUGHPUT_MIN_AFTER = 5;

  let token = null;
  let pollTimer = null;
  let generation = 0;  // bumps on navigation: late answers of an old view are dropped
  // Per job id: events seen so far and the step times around each version.
  const jobCache = new Map();

  const $ = (id) => document.getElementById(id);

  // el("td", {className: "num"}, "text", childNode, ...): text children become text nodes.
  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (k === "dataset") Object.assign(node.dataset, v);
      else node[k] = v;
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  class AuthError extends Error {}

  async function api(path, init) {
    const headers = { Accept: "application/json" };
    if (token !== null) headers.Authorization = "Bearer " + token;
    if (init && init.body !== undefined) headers["Content-Type"] = "application/json";
    const res = await fetch(path, Object.assign({ headers, cache: "no-store" }, init || {}));
    let body = null;
    try { body = await res.json(); } catch (e) { body = null; }
    if (res.status === 401) throw new AuthError(body && body.message ? body.message : "401");
    if (!res.ok) {
      const what = body ? (body.code || "") + ": " + (body.message || "") : "HTTP " + res.status;
      throw new Error(what);
    }
    return body;
  }

  const jobPath = (id) => "/v1/jobs/" + encodeURIComponent(id);
  const enumName = (v, prefix) => String(v || "").replace(prefix, "").toLowerCase();
  // "input_pipeline"; "" for none (docs/detection.md, "Likely cause").
  const causeName = (v) => (v && v !== "LIKELY_CAUSE_UNSPECIFIED" ? enumName(v, "LIKELY_CAUSE_") : "");
  const fmtSeconds = (s) => (s > 0 ? (s >= 1 ? s.toFixed(2) + " s" : (s * 1000).toFixed(1) + " ms") : "–");
  const fmtRatio = (r) => (r > 0 ? r.toFixed(2) + "×" : "–");
  const fmtTime = (t) => (t ? new Date(t).toLocaleTimeString() : "–");
  const num = (v) => Number(v || 0);

  function setStatus(text) { $("status").textContent = text; }

  function showTokenForm(why) {
    $("token-why").textContent = why;
    $("token-form").hidden = false;
    $("token-input").focus();
  }

  function renderAuthState() {
    const box = $("auth-state");
    box.replaceChildren();
    if (token === null) {
      box.append(el("button", { type: "button", onclick: () =>
        showTokenForm("Admin actions (override a rank, change the policy, reset) need the daemon's bearer token.") },
        "Enter admin token"));
    } else {
      box.append("token in use ", el("button", { type: "button", onclick: () => {
        token = null;
        renderAuthState();
        navigate();
      } }, "Forget token"));
    }
  }

  // ---- jobs list -------------------------------------------------------------

  // The replica that owns a job (replicas on etcd, docs/cluster.md): a link to
  // the job on that replica's console. Every replica answers for every job
  // (it asks the owner), so the link is for going where the job is decided.
  // "–" for a stragglerd alone (no owner field).
  function ownerLink(j) {
    const o = j.owner;
    if (!o || !o.id) return "–";
    if (!o.httpAddress) return o.id;
    return el("a", { href: location.protocol + "//" + o.httpAddress + "/console/#/jobs/" +
      encodeURIComponent(j.jobId), title: "this job on its owner, replica " + o.id }, o.id);
  }

  async function renderJobs(gen) {
    const data = await api("/v1/jobs");
    if (gen !== generation) return;
    const jobs = data.jobs || [];
    const replicas = jobs.some((j) => j.owner && j.owner.id);
    const rows = jobs.map((j) => el("tr", { dataset: { job: j.jobId } },
      el("td", {}, el("a", { href: "#/jobs/" + encodeURIComponent(j.jobId) }, j.jobId)),
      el("td", {}, j.runId || "–"),
      el("td", { className: "num" }, j.worldSize),
      el("td", { className: "num" }, j.activeRanks),
      el("td", { className: "num" }, j.excludedRanks),
      el("td", { className: "num" }, j.stragglerRanks),
      el("td", { className: "num" }, j.mildRanks || 0),
      el("td", { className: "num" }, j.unresponsiveRanks),
      el("td", { className: "num" }, j.highestIteration),
      el("td", { className: "num" }, fmtSeconds(num(j.stepSeconds))),
      el("td", {}, j.finished ? "finished" : j.lost ? "ended unexpectedly" : fmtTime(j.lastReportTime)),
      ...(replicas ? [el("td", {}, ownerLink(j))] : [])));
    $("main").replaceChildren(
      el("h1", {}, "Jobs"),
      jobs.length === 0 ? el("p", { className: "muted" }, "No jobs yet: none has sent a report.")
        : el("table", { id: "jobs" },
          el("thead", {}, el("tr", {}, ...["job", "run", "ranks", "active", "excluded", "stragglers",
            "mild", "unresponsive", "iteration", "step time", "last report",
            ...(replicas ? ["owner"] : [])].map((h) => el("th", {}, h)))),
          el("tbody", {}, ...rows)));
  }

  // ---- one job ---------------------------------------------------------------

  function cacheOf(id) {
    if (!jobCache.has(id)) jobCache.set(id, { events: [], lastSeq: "0", steps: new Map() });
    return jobCache.get(id);
  }

  async function fetchNewEvents(id, cache) {
    for (let page = 0; page < 20; ++page) {
      const data = await api(jobPath(id) + "/events?since=" + cache.lastSeq + "&limit=1000");
      const events = data.events || [];
      cache.events.push(...events);
      if (events.length) cache.lastSeq = events[events.length - 1].sequence;
      if (events.length < 1000) break;
    }
    if (cache.events.length > 5000) cache.events.splice(0, cache.events.length - 5000);
  }

  // Ranks of an "excluded [3 (straggler), 5 (forced)] ..." membership message.
  function excludedOf(message) {
    const m = /excluded \[([^\]]*)\]/.exec(message || "");
    const out = new Map();
    if (!m) return out;
    for (const x of m[1].matchAll(/(\d+) \(([a-z_]+)\)/g)) out.set(Number(x[1]), x[2]);
    return out;
  }

  // Mean job step time over [from, to): per iteration, the slowest compute
  // time among the ranks in the collective then (not in `excluded`), which is
  // what a synchronous step waited for. Taken from the reports of each
  // iteration, not from the job's step time when they were accepted: ranks
  // run ahead of a straggler, so that value lags behind their iterations.
  function meanStep(reports, from, to, excluded) {
    const perIteration = new Map();
    for (const r of reports) {
      const it = num(r.iteration), rank = num(r.rank), c = num(r.computeSeconds);
      if (it < from || it >= to || excluded.has(rank) || !(c > 0)) continue;
      perIteration.set(it, Math.max(perIteration.get(it) || 0, c));
    }
    if (perIteration.size === 0) return { mean: 0, n: 0 };
    let sum = 0;
    for (const v of perIteration.values()) sum += v;
    return { mean: sum / perIteration.size, n: perIteration.size };
  }

  // Step time before and after the version taking effect at `effective`
  // (excluding `before` ranks, then `after` ranks); kept once both sides are
  // full, so a finished answer is not asked again.
  async function stepChange(id, cache, version, effective, worldSize, beforeSet, afterSet) {
    const known = cache.steps.get(version);
    if (known && known.final) return known;
    const from = Math.max(0, effective - THROUGHPUT_WINDOW);
    const data = await api(jobPath(id) + "/reports?since_iteration=" + from + "&limit=" +
      (2 * THROUGHPUT_WINDOW * Math.max(1, worldSize)));
    const reports = data.reports || [];
    const before = meanStep(reports, effective - THROUGHPUT_WINDOW, effective, beforeSet);
    const after = meanStep(reports, effective, effective + THROUGHPUT_WINDOW, afterSet);
    const result = { before: before.mean, after: after.n >= THROUGHPUT_MIN_AFTER ? after.mean : 0,
      final: before.n + after.n >= Math.min(effective, THROUGHPUT_WINDOW) + THROUGHPUT_WINDOW };
    cache.steps.set(version, result);
    return result;
  }

  function heatmap(reports, scores, worldSize, threshold, workers) {
    const iterations = [...new Set(reports.map((r) => num(r.iteration)))].sort((a, b) => a - b)
      .slice(-HEATMAP_ITERATIONS);
    const column = new Map(iterations.map((it, i) => [it, i]));
    // Rows grouped by declared peer group (docs/topology.md), ranks ascending
    // within a group: a stage slower by design shows as one band.
    const group = new Map(workers.map((w) => [num(w.rank), w.peerGroup || ""]));
    const order = [...Array(worldSize).keys()].sort((a, b) =>
      (group.get(a) || "").localeCompare(group.get(b) || "") || a - b);
    const rowOf = new Map(order.map((rank, i) => [rank, i]));
    // Rows shrink for large jobs so the map stays about a screen tall.
    const cell = 10, row = Math.max(1, Math.min(10, Math.floor(1280 / Math.max(1, worldSize))));
    const left = 44, top = 4;
    const canvas = el("canvas", { id: "heatmap", width: left + HEATMAP_ITERATIONS * cell + 4,
      height: top + worldSize * row + 18 });
    const g = canvas.getContext("2d");
    g.fillStyle = "#fff";
    g.fillRect(0, 0, canvas.width, canvas.height);
    g.font = "9px sans-serif";
    g.fillStyle = "#555";
    for (let r = 0; r < worldSize; ++r) {
      const rank = order[r], name = group.get(rank);
      if (row >= 9 || r % Math.ceil(10 / row) === 0) {
        g.fillText(name ? name.slice(0, 6) + " " + rank : "rank " + rank, 2, top + r * row + 8);
      }
    }
    reports.forEach((r, i) => {
      const x = column.get(num(r.iteration));
      if (x === undefined || num(r.rank) >= worldSize) return;
      const ratio = scores[i] ? num(scores[i].ratio) : 0;
      g.fillStyle = ratio <= 0 ? "#ccc" : ratio < 1.25 ? "#66bb6a" : ratio < threshold ? "#ffb74d" : "#e53935";
      g.fillRect(left + x * cell, top + rowOf.get(num(r.rank)) * row, cell - 1, Math.max(1, row - 1));
    });
    if (iterations.length) {
      g.fillStyle = "#555";
      g.fillText("iteration " + iterations[0], left, top + worldSize * row + 12);
      const last = "iteration " + iterations[iterations.length - 1];
      g.fillText(last, left + iterations.length * cell - g.measureText(last).width, top + worldSize * row + 12);
    }
    return el("div", {}, canvas, el("div", { className: "legend" },
      "Each cell: one report's compute time over the job's reference (baseline) when it was accepted. ",
      "green < 1.25×, orange < " + threshold.toFixed(2) + "× (the policy's threshold factor), red above; grey: no reference yet."));
  }

  function gpuText(w) {
    const g = w.gpu;
    if (!g) return "–";
    const parts = [];
    if (g.gpuUtilization !== undefined) parts.push("util " + Math.round(g.gpuUtilization * 100) + "%");
    if (g.smClockHertz !== undefined) parts.push("SM " + (g.smClockHertz / 1e9).toFixed(2) + " GHz");
    if (g.temperatureCelsius !== undefined) parts.push(Math.round(g.temperatureCelsius) + " °C");
    if (g.powerWatts !== undefined) parts.push(Math.round(g.powerWatts) + " W");
    return (parts.join(", ") || "reported") + (w.gpuStale ? " (stale)" : "");
  }

  function workersTable(workers, membership) {
    const excluded = new Map((membership.excluded || []).map((x) => [num(x.rank), x]));
    const rows = workers.map((w) => {
      const rank = num(w.rank);
      // The worker says whether it is out now: nobody is once the job ended
      // (finished or lost), though the last version still names its ranks.
      const x = w.excluded ? excluded.get(rank) || { reason: w.exclusionReason } : undefined;
      const state = x ? "excluded" : enumName(w.state, "WORKER_STATE_");
      const reason = x ? enumName(x.reason, "EXCLUSION_REASON_") + (x.detail ? ": " + x.detail : "") : "";
      const override = enumName(w.override, "RANK_OVERRIDE_");
      return el("tr", { dataset: { rank: String(rank), state } },
        el("td", { className: "num" }, rank),
        el("td", {}, w.node || "–"),
        el("td", { className: "group" }, (w.peerGroup || "–") +
          (w.replica !== undefined ? " / r" + num(w.replica) : "")),
        el("td", { className: "state state-" + state }, state,
          // Its client does not act on membership: a straggler it stays in.
          w.monitorOnly ? el("div", { className: "muted monitor-only" }, "monitoring only") : null,
          // A straggler's likely cause, the numbers behind it on hover.
          causeName(w.likelyCause) ? el("div", { className: "cause", title: w.likelyCauseDetail || "" },
            "cause: " + causeName(w.likelyCause)) : null),
        el("td", { className: "num" }, num(w.counter) + " / " + num(w.limit)),
        el("td", { className: "num ratio" }, fmtRatio(num(w.slowdownRatio))),
        el("td", { className: "num" }, fmtSeconds(num(w.lastComputeSeconds))),
        el("td", { className: "num" }, w.lastIteration),
        el("td", { className: "reason" }, reason || "–",
          override && override !== "unspecified" ? el("div", { className: "muted" }, "override: " + override) : null),
        el("td", {}, gpuText(w)));
    });
    return el("table", { id: "ranks" },
      el("thead", {}, el("tr", {}, ...["rank", "node", "group / replica", "state", "counter", "ratio", "last compute",
        "iteration", "reason", "GPU"].map((h) => el("th", {}, h)))),
      el("tbody", {}, ...rows));
  }

  async function timelineTable(id, cache, job, membership) {
    const versions = cache.events.filter((e) => e.kind === "EVENT_KIND_MEMBERSHIP");
    const rows = [];
    let previous = new Map();
    for (const e of versions) {
      const now = excludedOf(e.message);
      const changes = [];
      for (const [rank, why] of now) if (!previous.has(rank)) changes.push("excluded rank " + rank + " (" + why + ")");
      for (const rank of previous.keys()) if (!now.has(rank)) changes.push("readmitted rank " + rank);
      const was = previous;
      previous = now;
      const version = num(e.membershipVersion), effective = num(e.iteration);
      const step = await stepChange(id, cache, version, effective, num(job.worldSize), was, now);
      let throughput = step.before > 0 ? "measuring…" : "–";
      let cls = "";
      if (step.before > 0 && step.after > 0) {
        const change = (step.after / step.before - 1) * 100;
        throughput = fmtSeconds(step.before) + " → " + fmtSeconds(step.after) + " (" +
          (change >= 0 ? "+" : "") + change.toFixed(0) + "% step time)";
        cls = change < 0 ? "gain" : "loss";
      }
      rows.push(el("tr", { dataset: { version: String(version) } },
        el("td", { className: "num" }, version),
        el("td", { className: "num" }, effective),
        el("td", {}, fmtTime(e.time)),
        el("td", { className: "change" }, changes.join("; ") || "no change of the excluded set"),
        el("td", { className: cls }, throughput),
        el("td", { className: "muted" }, e.message)));
    }
    const ended = job.finished ? "finished" : job.lost ? "ended unexpectedly" : "";
    const current = el("p", {}, (ended ? "The job " + ended + ": nobody is excluded now. Last version " :
      "In force: version ") + num(membership.version) + " from iteration " +
      num(membership.effectiveIteration) + ", excluded: " +
      ((membership.excluded || []).map((x) => String(x.rank)).join(", ") || "none"));
    return el("div", {}, current, el("table", { id: "timeline" },
      el("thead", {}, el("tr", {}, ...["version", "from iteration", "time", "change",
        "job step time, " + THROUGHPUT_WINDOW + " iterations before → after", "message"].map((h) => el("th", {}, h)))),
      el("tbody", {}, ...rows.reverse())));
  }

  function eventsTable(events) {
    const rows = events.slice(-EVENTS_SHOWN).reverse().map((e) => el("tr", { dataset: { kind: enumName(e.kind, "EVENT_KIND_") } },
      el("td", { className: "num" }, e.sequence),
      el("td", {}, fmtTime(e.time)),
      el("td", {}, enumName(e.kind, "EVENT_KIND_")),
      el("td", { className: "num" }, e.rank === undefined ? "–" : e.rank),
      el("td", {}, e.from || e.to ? enumName(e.from, "WORKER_STATE_") + " → " + enumName(e.to, "WORKER_STATE_") : ""),
      el("td", { className: "num" }, e.iteration),
      el("td", { className: "message" }, e.message,
        e.evidence && causeName(e.evidence.likelyCause) ? el("div", { className: "cause" },
          "likely cause " + causeName(e.evidence.likelyCause) +
          (e.evidence.likelyCauseDetail ? ": " + e.evidence.likelyCauseDetail : "")) : null)));
    return el("table", { id: "events" },
      el("thead", {}, el("tr", {}, ...["#", "time", "kind", "rank", "state", "iteration", "message"].map((h) => el("th", {}, h)))),
      el("tbody", {}, ...rows));
  }

  async function renderJob(id, gen) {
    const cache = cacheOf(id);
    const [job, workers, membership] = await Promise.all([
      api(jobPath(id)), api(jobPath(id) + "/workers"), api(jobPath(id) + "/membership")]);
    await fetchNewEvents(id, cache);
    const highest = num(job.highestIteration);
    const reports = await api(jobPath(id) + "/reports?since_iteration=" +
      Math.max(0, highest - HEATMAP_ITERATIONS + 1));
    const timeline = await timelineTable(id, cache, job, membership);
    if (gen !== generation) return;
    const threshold = num(job.policy && job.policy.thresholdFactor) || 1.5;
    const summary = el("div", { className: "summary" },
      ...[["ranks", job.worldSize], ["active", job.activeRanks], ["excluded", job.excludedRanks],
        ["stragglers", job.stragglerRanks], ["mild", job.mildRanks || 0],
        ["unresponsive", job.unresponsiveRanks],
        ["iteration", job.highestIteration], ["step time", fmtSeconds(num(job.stepSeconds))],
        ["baseline", fmtSeconds(num(job.baselineSeconds))], ["threshold", fmtSeconds(num(job.thresholdSeconds))],
        ["policy", enumName(job.policy && job.policy.kind, "POLICY_KIND_")], ["run", job.runId || "–"],
        ...(job.owner && job.owner.id ? [["owner", ownerLink(job)]] : [])]
        .map(([k, v]) => el("div", {}, el("b", {}, v), k)));
    $("job-data").replaceChildren(
      summary,
      el("h2", {}, "Ranks"), workersTable(workers.workers || [], membership),
      el("h2", {}, "Rank heatmap (last " + HEATMAP_ITERATIONS + " iterations)"),
      heatmap(reports.reports || [], reports.scores || [], num(job.worldSize), threshold,
        workers.workers || []),
      el("h2", {}, "Membership timeline and throughput"), timeline,
      el("h2", {}, "Events"), eventsTable(cache.events));
  }

  function adminPanel(id) {
    const result = el("div", { className: "muted", id: "admin-result" });
    const show = (p) => p.then((r) => { result.className = "muted"; result.textContent = "done: " + JSON.stringify(r).slice(0, 300); refresh(); },
      (e) => { result.className = "error"; result.textContent = e instanceof AuthError ? "the token was refused: " + e.message : String(e.message); });
    const rank = el("input", { type: "number", min: 0, value: "0", id: "override-rank", required: true });
    const kind = el("select", { id: "override-kind" }, ...["force_exclude", "force_include", "none"].map((k) => el("option", { value: k }, k)));
    const reason = el("input", { type: "text", id: "override-reason", size: 40, placeholder: "reason (shown in events)" });
    const override = el("form", { id: "override-form", onsubmit: (ev) => {
      ev.preventDefault();
      show(api(jobPath(id) + "/workers/" + encodeURIComponent(rank.value) + "/override",
        { method: "PUT", body: JSON.stringify({ override: kind.value, reason: reason.value }) }));
    } }, "Override rank ", rank, " ", kind, " ", reason, " ", el("button", { type: "submit" }, "Apply"));
    const policy = el("textarea", { id: "policy-json", placeholder: '{"thresholdFactor": 1.5}' });
    const policyForm = el("form", { id: "policy-form", onsubmit: (ev) => {
      ev.preventDefault();
      show(api(jobPath(id) + "/policy", { method: "PUT", body: policy.value }));
    } }, "Policy fields to change (PolicyConfig JSON):", policy, el("button", { type: "submit" }, "Set policy"));
    const sure = el("input", { type: "checkbox", id: "reset-sure" });
    const reset = el("form", { onsubmit: (ev) => {
      ev.preventDefault();
      if (sure.checked) show(api(jobPath(id) + "/reset", { method: "POST", body: "" }));
    } }, el("label", {}, sure, " I mean it: "), el("button", { type: "submit" }, "Reset the job (forget profile and states)"));
    return el("div", { className: "admin", id: "admin" }, el("h2", {}, "Admin"), override, policyForm, reset, result);
  }

  // ---- routing and polling ---------------------------------------------------

  function currentJob() {
    const m = /^#\/jobs\/([^/]+)$/.exec(location.hash);
    return m ? decodeURIComponent(m[1]) : null;
  }

  async function refresh() {
    clearTimeout(pollTimer);
    const gen = generation;
    const id = currentJob();
    try {
      if (id === null) await renderJobs(gen); else await renderJob(id, gen);
      if (gen !== generation) return;
      $("token-form").hidden = true;
      setStatus("live, updated " + new Date().toLocaleTimeString());
    } catch (e) {
      if (gen !== generation) return;
      if (e instanceof AuthError) {
        // Nothing of a job stays on screen without the token.
        $("main").replaceChildren();
        setStatus("token needed");
        showTokenForm(token === null
          ? "This daemon protects its reads (auth.protect_reads): enter the bearer token."
          : "The daemon refused the token: " + e.message);
        return;  // no polling until a token is given
      }
      setStatus("error: " + e.message + " (retrying)");
    }
    if (gen === generation) pollTimer = setTimeout(refresh, POLL_MS);
  }

  function navigate() {
    ++generation;
    const id = currentJob();
    if (id === null) {
      $("main").replaceChildren(el("p", { className: "muted" }, "loading…"));
    } else {
      $("main").replaceChildren(el("h1", {}, "Job ", el("span", { id: "job-id" }, id)),
        el("p", {}, el("a", { href: "#/" }, "← all jobs")),
        el("div", { id: "job-data" }, el("p", { className: "muted" }, "loading…")),
        ...(token !== null ? [adminPanel(id)] : []));
    }
    refresh();
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("token-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const input = $("token-input");
      token = input.value.trim() || null;
      input.value = "";
      $("token-form").hidden = true;
      renderAuthState();
      navigate();
    });
    window.addEventListener("hashchange", navigate);
    renderAuthState();
    navigate();
  });
})();
