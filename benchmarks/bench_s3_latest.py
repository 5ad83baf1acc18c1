"""latest() on an S3 root against a bare paginated ListObjectsV2 of the same prefix,
side by side in one run, at 10^4 publications (10 pages of 1000 keys).

Bare: list_objects_v2 page by page to the end, keeping nothing but the keys. latest()
adds what the protocol needs: the names cut from the keys, every one validated
(names.all_valid), the greatest parsed. Both use one boto3 client, so the ratio is
latest's own cost over the listing's. The server is started here, on loopback:
moto's (default) or a one-node Ceph RGW (--server ceph, needs Debian's packages).

    python benchmarks/bench_s3_latest.py [--n 10000] [--rounds 5] [--server moto|ceph]
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import s3server  # noqa: E402  (the tests' server starters)

from dispatch_slurm import store  # noqa: E402
from dispatch_slurm.contract import names  # noqa: E402
from dispatch_slurm.store import s3  # noqa: E402


def populate(srv, bucket: str, n: int) -> None:
    c = srv.client()
    keys = ["run/pub/" + names.encode(1_000_000 + i % 7, i, f"exec/linux.{1000 + i % 7}.{1_000_000 + i % 7}/"
                                       f"checkpoint-{i}") for i in range(n)]
    for k in range(7):  # each epoch's claim, as env made it: latest() reads the latest's
        c.put_object(Bucket=bucket, Key=f"run/epochs/{names.claim_name(1_000_000 + k)}",
                     Body=f"linux.{1000 + k}.{1_000_000 + k}\n".encode())
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: c.put_object(Bucket=bucket, Key=k, Body=b""), keys))


def bare(c, bucket: str) -> int:
    kw, n = {"Bucket": bucket, "Prefix": "run/pub/"}, 0
    while True:
        page = c.list_objects_v2(**kw)
        n += len([o["Key"] for o in page.get("Contents", ())])
        if not page.get("IsTruncated"):
            return n
        kw["ContinuationToken"] = page["NextContinuationToken"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--server", choices=["moto", "ceph"], default="moto")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-s3-")
    srv = s3server.start_moto() if a.server == "moto" else s3server.start_ceph(tmp)
    if srv is None:
        sys.exit("no radosgw on this machine (tools/setup-host installs it)")
    try:
        os.environ.update(srv.env)
        bucket = srv.bucket()
        t = time.perf_counter()
        populate(srv, bucket, a.n)
        print(f"{a.server}: {a.n} publications written in {time.perf_counter() - t:.1f} s")
        root, c = f"s3://{bucket}/run", s3.client()
        assert bare(c, bucket) == a.n and store.latest(root) is not None
        wall = {"bare": [], "latest": []}
        cpu = {"bare": [], "latest": []}  # this process's CPU: the client's own work
        for _ in range(a.rounds):  # alternate, so drift hits both
            for what, fn in (("bare", lambda: bare(c, bucket)), ("latest", lambda: store.latest(root))):
                t, p = time.perf_counter(), time.process_time()
                fn()
                wall[what].append(time.perf_counter() - t)
                cpu[what].append(time.process_time() - p)
        print(f"latest() vs bare ListObjectsV2 ({-(-a.n // 1000)} pages), median of {a.rounds} alternating rounds")
        print(f"  {'':10} {'bare':>9} {'latest':>9} {'ratio':>6}")
        for label, m in (("wall", wall), ("client CPU", cpu)):
            b, t = statistics.median(m["bare"]), statistics.median(m["latest"])
            print(f"  {label:10} {b:8.3f}s {t:8.3f}s {t / b:5.2f}x")
        print("  goal: latest <= 1.3x the bare listing")
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
