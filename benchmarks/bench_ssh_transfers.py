#!/usr/bin/env python3
"""ssh file transfers on loopback: the driver's paths against paramiko's pipelined SFTP get.

    python benchmarks/bench_ssh_transfers.py [--mb 64] [--small 50] [--runs 3]

Starts two sshds from the test fixtures (tests/fixtures_ssh.py): one with the SFTP subsystem,
one without. Measures, as medians, each against paramiko's SFTP get with prefetch (what the
driver used before; its helper thread is why it is gone) on the first server in the same run:
fetching one N MB file (the driver streams it through `cat`, size and sha256 checked), fetching
many 4 KB files from the first server (the driver: sequential SFTP reads) and from the second
(the driver: `cat` over exec, one command per file). Then uploading the N MB file, by `cat >
file` on the second server against SFTP on the first. Prints the ratios. Needs openssh-server
and the ssh extra (paramiko); says so and exits 0 without them.
"""

from __future__ import annotations

import argparse
import os
import posixpath
import sys
import tempfile
from pathlib import Path

from bench_timing import median_s

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=64)
    parser.add_argument("--small", type=int, default=50, help="number of 4 KB files")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    try:
        import paramiko  # noqa: F401 - only: is the ssh extra there?
    except ImportError:
        print("skipped: paramiko is missing (pip install 'onnx-verify[ssh]')")
        return 0
    from fixtures_ssh import SSHD, start_sshd

    if not SSHD.is_file():
        print(f"skipped: {SSHD} is missing (Debian: openssh-server)")
        return 0
    from verify.drivers import make_driver

    with tempfile.TemporaryDirectory(prefix="bench-ssh-") as tmp_name:
        tmp = Path(tmp_name)
        with_sftp = start_sshd(tmp / "sftp")
        without = start_sshd(tmp / "nosftp", sftp=False)
        try:
            big = tmp / "big.bin"
            big.write_bytes(os.urandom(args.mb << 20))
            small_dir = tmp / "small"
            small_dir.mkdir()
            smalls = []
            for i in range(args.small):
                (small_dir / f"{i}.bin").write_bytes(os.urandom(4096))
                smalls.append(str(small_dir / f"{i}.bin"))
            out = tmp / "out"
            out.mkdir()
            rows = []
            with make_driver(with_sftp.profile(str(tmp / "dev1"))) as d, \
                    make_driver(without.profile(str(tmp / "dev2"))) as bare:
                sftp = d._transport("bench").open_sftp_client()  # the old download path

                def old_get(paths: list[str]) -> None:
                    for path in paths:
                        sftp.get(path, str(out / "old"))

                def new_get(driver: object, paths: list[str]) -> None:
                    for path in paths:
                        driver.get(path, out / "new")

                rows.append(("get (cat)", f"1 x {args.mb} MB",
                             median_s(lambda: new_get(d, [str(big)]), args.runs),
                             median_s(lambda: old_get([str(big)]), args.runs)))
                rows.append(("get (sftp, serial)", f"{args.small} x 4 KB",
                             median_s(lambda: new_get(d, smalls), args.runs),
                             median_s(lambda: old_get(smalls), args.runs)))
                rows.append(("get (cat, no sftp)", f"{args.small} x 4 KB",
                             median_s(lambda: new_get(bare, smalls), args.runs),
                             median_s(lambda: old_get(smalls), args.runs)))
                sftp.close()
                d.makedirs(d.base_dir)
                bare.makedirs(bare.base_dir)
                rows.append(("put (cat, no sftp)", f"1 x {args.mb} MB",
                             median_s(lambda: bare.put(big, posixpath.join(bare.base_dir, "up")),
                                      args.runs),
                             median_s(lambda: d.put(big, posixpath.join(d.base_dir, "up")),
                                      args.runs)))
        finally:
            with_sftp.stop()
            without.stop()
    print("driver: what verify does now; baseline: paramiko SFTP get with prefetch (put: the "
          "driver's SFTP put)")
    print(f"{'driver path':20} {'files':14} {'driver s':>9} {'baseline s':>11} {'ratio':>7}")
    for what, size, new_s, old_s in rows:
        print(f"{what:20} {size:14} {new_s:9.3f} {old_s:11.3f} {new_s / old_s:6.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
