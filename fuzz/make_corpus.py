#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into fuzz/corpus/<target>/.

Run once (and again when the inputs a target reads change); the files are
kept in the repository and scripts/fuzz.sh starts every run from them.
Protobuf messages are encoded by hand (no python3-protobuf needed): field
numbers follow proto/straggler/v1/straggler.proto.

    python3 fuzz/make_corpus.py [TARGET...]
"""
import hashlib
import pathlib
import shutil
import struct
import sys

ROOT = pathlib.Path(__file__).resolve().parent
CORPUS = ROOT / "corpus"


def varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_varint(num, value):
    return varint(num << 3) + varint(value)


def field_bytes(num, data):
    if isinstance(data, str):
        data = data.encode()
    return varint(num << 3 | 2) + varint(len(data)) + data


def field_double(num, value):
    return varint(num << 3 | 1) + struct.pack("<d", value)


def hello(job="train-1", node="node-a", ranks=(0, 1), world=4, version=0, client="1.0",
          known_version=0, known_incarnation=0, packed=True, known_excluded=()):
    out = field_bytes(1, job) + field_bytes(2, node)
    if packed:
        out += field_bytes(3, b"".join(varint(r) for r in ranks))
    else:
        out += b"".join(field_varint(3, r) for r in ranks)
    out += field_varint(4, world) + field_varint(5, 100) + field_bytes(6, client)
    if known_version:
        out += field_varint(7, known_version) + field_varint(8, 50)
    if known_incarnation:
        out += field_varint(9, known_incarnation)
    out += field_bytes(10, field_varint(1, ranks[0] if ranks else 0) + field_varint(2, 0) +
                       field_bytes(3, "0,1") + field_bytes(4, "GPU-8f0c1d2e"))
    for rank, reason, detail in known_excluded:  # (rank, ExclusionReason number, detail)
        out += field_bytes(12, field_varint(1, rank) + field_varint(2, reason) +
                           field_bytes(3, detail) + field_varint(4, 40))
    return out


def report(rank, iteration, compute, epoch=0, step=None, wait=None, start=None):
    out = field_varint(1, rank) + field_varint(2, epoch) + field_varint(3, iteration)
    out += field_double(4, compute)
    if step is not None:
        out += field_double(5, step)
    if wait is not None:
        out += field_double(6, wait)
    if start is not None:
        seconds, nanos = start
        out += field_bytes(7, field_varint(1, seconds) + field_varint(2, nanos))
    return out


def telemetry(rank, gpu=0, sm=1.4e9, temp=65.0, util=0.9, uuid="GPU-8f0c1d2e", reasons=0):
    g = field_varint(1, gpu) + field_bytes(2, uuid)
    g += field_double(4, sm) + field_double(5, 1.5e9) + field_double(7, temp)
    g += field_double(8, 250.0) + field_double(9, 300.0) + field_double(10, util)
    g += field_double(11, 0.5) + field_varint(12, reasons)
    return field_varint(1, rank) + field_bytes(2, g)


def batch(h=None, reports=(), seq=1, tel=()):
    out = b""
    if h is not None:
        out += field_bytes(1, h)
    out += b"".join(field_bytes(2, r) for r in reports)
    out += field_varint(3, seq)
    out += b"".join(field_bytes(4, t) for t in tel)
    return out


def ingest_seeds():
    nan, inf = float("nan"), float("inf")
    steady = [report(r, i, 0.1 + 0.01 * r) for i in range(1, 6) for r in range(4)]
    slow = [report(r, i, 0.5 if r == 3 else 0.1, step=0.12, wait=0.01) for i in range(1, 30)
            for r in range(4)]
    yield batch(hello(ranks=(0, 1, 2, 3)), steady)
    yield batch(hello(ranks=(0, 1, 2, 3)), slow, tel=[telemetry(3, reasons=0x20)])
    yield batch(hello(packed=False), [report(0, 1, 0.2), report(1, 1, 0.3)])
    yield batch(hello(), [report(0, 2, 0.1), report(0, 1, 0.1), report(0, 2, 0.1)])  # stale, dup
    yield batch(hello(), [report(0, 1, nan), report(1, 1, -1.0), report(0, 2, inf)])
    yield batch(hello(), [report(0, 1, 0.1, step=-2.0), report(1, 1, 0.1, wait=nan)])
    yield batch(hello(), [report(9, 1, 0.1), report(1 << 31, 1, 0.1)])  # rank out of range
    yield batch(hello(), [report(0, 1, 0.1, start=(1_700_000_000, 5))])
    yield batch(hello(), [report(0, 1, 0.1, start=(9_223_372_035, 2_000_000_000))])
    yield batch(hello(), [report(0, (1 << 64) - 1, 1e300, epoch=(1 << 64) - 1)])
    yield batch(hello(known_version=7, known_incarnation=12345), [report(0, 51, 0.1)])
    # A held forced exclusion (never an override), and refused ones: an
    # unknown reason, a detail with control characters, one too long.
    yield batch(hello(known_version=7, known_incarnation=12345, known_excluded=[(2, 3, "op")]),
                [report(0, 51, 0.1)])
    yield batch(hello(known_version=7, known_excluded=[(2, 99, "x")]))
    yield batch(hello(known_version=7, known_excluded=[(2, 1, "slow\r\nforged")]))
    yield batch(hello(known_version=7, known_excluded=[(3, 1, "d" * 1025)]))
    yield batch(hello(job="", ranks=(0,)))
    yield batch(hello(job="a b", ranks=(0,)))
    yield batch(hello(job="x" * 200, ranks=(0,)))
    yield batch(hello(node="node\nb"))
    yield batch(hello(world=0))
    yield batch(hello(world=1 << 20))
    yield batch(hello(ranks=()))
    yield batch(hello(ranks=(0, 4)))
    yield batch(hello(ranks=(1, 1, 0, 1)))
    yield batch(None, [report(0, 1, 0.1)])
    yield batch(hello(), tel=[telemetry(0, sm=-1.0), telemetry(1, util=1.5),
                              telemetry(1, temp=nan), telemetry(0, uuid="GPU-\x01")])
    yield batch(hello(world=256, ranks=tuple(range(256))),
                [report(r, 1, 0.1) for r in range(256)])


def config_seeds():
    yield (ROOT.parent / "deploy" / "stragglerd.yaml").read_bytes()
    yield b""
    yield b"grpc_address: 127.0.0.1:0\nhttp_address: 127.0.0.1:0\nlog_level: debug\n"
    yield b"policy:\n  kind: ewma\n  ewma_alpha: 0.2\n  ewma_ratio: 1.5\n"
    yield b"policy:\n  kind: static\n  static_threshold_seconds: 0.5\n"
    yield b"policy:\n  threshold_factor: 0.5\n"
    yield b"policy: {limit: -1}\n"
    yield b"jobs:\n  - match: 'bert-*'\n    policy: {kind: ewma}\n  - match: '*'\n"
    yield b"jobs:\n  - policy: {kind: ewma}\n"
    yield b"jobs: {match: x}\n"
    yield (b"limits:\n  max_jobs: 10\n  max_ranks_per_job: 64\n  max_batch_reports: 5\n"
           b"  max_streams: 10\n  stream_reports_per_second: 100\n  stream_reports_burst: 200\n"
           b"  max_message_bytes: 65536\n")
    yield b"limits:\n  max_jobs: 0\n"
    yield b"limits:\n  max_jobs: 99999999999\n"
    yield b"http:\n  threads: 300\n  read_timeout_seconds: 1\n"
    yield b"rendezvous:\n  default_ttl_seconds: 10\n  max_ttl_seconds: 5\n"
    yield b"persistence:\n  path: /tmp/x.db\n  synchronous: extra\n"
    yield b"metrics:\n  per_rank_max_ranks: 0\n"
    yield b"unknown_key: 1\n"
    yield b"- a\n- b\n"
    yield b"policy: [\n"
    yield b"a: &x [*x]\n"
    yield b"policy:\n  kind: !!binary aGVsbG8=\n"
    yield b"{" * 64 + b"}" * 64 + b"\n"


def rest_seeds():
    for line in [
        "GET /v1/jobs",
        "GET /v1/jobs/train-1",
        "GET /v1/jobs/train%2Ea-1%5Fb",
        "GET /v1/jobs/a%2Fb/workers",
        "GET /v1/jobs/train-1/workers/3",
        "GET /v1/jobs/train-1/workers/abc",
        "GET /v1/jobs/train-1/workers/99999999999",
        "HEAD /v1/jobs/train-1/membership",
        "GET /v1/jobs/train-1/events?since=3&limit=10",
        "GET /v1/events?since_time=2024-05-01T12:00:00+02:00",
        "GET /v1/events?since_time=yesterday",
        "GET /v1/events?limit=10001",
        "GET /v1/events?limit=1&limit=2",
        "GET /v1/jobs/train-1/reports?since_iteration=10&limit=5",
        "GET /v1/jobs/train-1/reports?bogus=1",
        "GET /v1/jobs?x=%zz",
        "GET /v1/jobs/%",
        "DELETE /v1/jobs",
        "POST /v1/jobs/train-1/reset",
        "GET /metrics",
        "GET /healthz?verbose=1",
        "GET /readyz",
        "GET relative/path",
        "GET //",
        "GET /v1/jobs//workers",
    ]:
        yield line.encode()
    yield b'PUT /v1/jobs/train-1/policy\n{"kind": "POLICY_KIND_EWMA", "ewmaRatio": 1.8}'
    yield b'PUT /v1/jobs/train-1/policy\n{"thresholdFactor": "x"}'
    yield b'PUT /v1/jobs/train-1/policy\n{"nope": 1}'
    yield b"PUT /v1/jobs/train-1/policy\n"
    yield b'PUT /v1/jobs/train-1/workers/3/override\n{"override": "force_exclude", "reason": "ECC"}'
    yield b'PUT /v1/jobs/train-1/workers/3/override\n{"override": "RANK_OVERRIDE_NONE"}'
    yield b'PUT /v1/jobs/train-1/workers/3/override\n{"override": 3}'
    yield b'PUT /v1/jobs/train-1/workers/3/override\n{"reason": "x"}'
    yield b'PUT /v1/jobs/train-1/workers/3/override\n[1, 2]'
    yield b"POST /v1/jobs/train-1/reset\n{}"
    yield b"POST /v1/jobs/train-1/reset\n{\"a\": 1}"


def policy_seeds():
    """fuzz_policy: a mode byte (bit 0: 0 = REST JSON body, 1 = gRPC
    SetPolicyRequest; (byte >> 1) % 3: the job's policy before), then the body."""
    nan, inf = float("nan"), float("inf")
    for base in (0, 2, 4):
        for body in [
            '{"kind": "POLICY_KIND_EWMA", "ewmaRatio": 1.8}',
            '{"thresholdFactor": 2.5, "limit": 7, "rejoinMark": 2}',
            '{"unresponsiveAfterSeconds": 1e10}',
            '{"unresponsiveAfterSeconds": 604800}',
            '{"maxComputeSeconds": "Infinity"}',
            '{"thresholdFactor": "NaN"}',
            '{"limit": 4294967295}',
            '{"limit": 3}',
            '{"kind": "POLICY_KIND_STATIC"}',
            '{"kind": "POLICY_KIND_STATIC", "staticThresholdSeconds": 0.25}',
            '{"recovery": "RECOVERY_MODE_PROBATION", "windowIterations": 10000001}',
            '{"minThroughputGain": -1.5, "leadIterations": 0}',
            '{"kind": 7}',
            '{"nope": 1}',
            '{}',
            '',
        ]:
            yield bytes([base]) + body.encode()
    for base in (1, 3, 5):
        policies = [
            field_varint(1, 2) + field_double(10, 1.8),
            field_varint(2, 7) + field_double(6, 2.5) + field_varint(4, 2),
            field_double(18, 1e10),
            field_double(21, inf),
            field_double(6, nan),
            field_varint(2, (1 << 32) - 1),
            field_varint(1, 3) + field_double(12, 0.25),
            field_varint(1, 9),
            field_varint(8, 5),
            field_varint(17, 0) + field_double(16, -1.5),
            field_varint(19, 0) + field_double(13, 1.0) + field_varint(14, 10_000_001),
            b"",
        ]
        for pol in policies:
            yield bytes([base]) + field_bytes(1, "train-1") + field_bytes(2, pol)


def write(target, seeds):
    out = CORPUS / target
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for data in seeds:
        # Content-named, like libFuzzer's own corpus files.
        (out / hashlib.sha1(data).hexdigest()).write_bytes(data)
    print(f"{out.relative_to(ROOT.parent)}: {len(list(out.iterdir()))} seeds")


SEEDS = {"fuzz_ingest": ingest_seeds, "fuzz_config": config_seeds, "fuzz_rest": rest_seeds,
         "fuzz_policy": policy_seeds}
# Named targets only (python3 fuzz/make_corpus.py fuzz_policy): rewriting a
# corpus drops what FUZZ_MERGE=1 runs added to it.
for name in sys.argv[1:] or SEEDS:
    write(name, SEEDS[name]())
