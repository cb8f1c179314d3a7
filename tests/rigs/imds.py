"""AWS's own EC2 instance metadata mock (``github.com/aws/amazon-ec2-metadata-mock``, built and cached by
``.ci/ec2-metadata-mock``) as one process per "instance", on a free loopback port, IMDSv2 only (``-I``).

Every notice is scheduled explicitly: the mock serves the spot interruption ``mock-delay-sec`` after its start and
the rebalance recommendation ``rebalance-delay-sec`` after it, both 0 (at once) by default, so a machine without a
notice gets delays far beyond any test. The interruption's ``time`` (when EC2 takes the machine) and the user-data
and instance id come from a config file (``-c``; user-data is given base64, as the mock wants it).
"""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import time
from pathlib import Path

import attrs
import trio

from rigs import procs, wait
from rigs.backends import missing

ROOT = Path(__file__).resolve().parents[2]
#: "Never" for a notice: far beyond any test's length.
NEVER = 10**6


def binary() -> Path:
    """The cached mock; ``missing`` (fail in CI, skip elsewhere) when it is not built."""
    done = subprocess.run(
        [str(ROOT / ".ci" / "ec2-metadata-mock"), "path"], capture_output=True, text=True, check=False
    )
    path = Path(done.stdout.strip())
    if done.returncode != 0 or not path.is_file():
        missing(f"the EC2 metadata mock is not built ({ROOT / '.ci' / 'ec2-metadata-mock'} build)")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@attrs.frozen
class Imds:
    url: str
    proc: procs.Proc
    started_at: float  # wall clock, just before the process started (the mock's delays count from its start)


async def start(
    started: procs.Procs,
    home: Path,
    *,
    user_data: str = "",
    instance_id: str = "i-0123456789abcdef0",
    spot_delay: int = NEVER,
    spot_time: str = "",
    rebalance_delay: int = NEVER,
) -> Imds:
    """Start a mock under ``home`` (its config and log there) and wait until it hands out IMDSv2 tokens."""
    home.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - a test rig's few local files
    config: dict[str, object] = {"metadata": {"values": {"instance-id": instance_id}}}
    if user_data:
        config["userdata"] = {"values": {"userdata": base64.b64encode(user_data.encode()).decode()}}
    if spot_time:
        config["spot"] = {"time": spot_time}
    (home / "aemm-config.json").write_text(json.dumps(config))  # noqa: ASYNC240
    port = free_port()
    argv = [
        binary(),
        "-I",
        "-n",
        "127.0.0.1",
        "-p",
        str(port),
        "-c",
        home / "aemm-config.json",
        "-d",
        str(spot_delay),
        "--rebalance-delay-sec",
        str(rebalance_delay),
    ]
    at = time.time()
    proc = await started.start(f"imds-{home.name}", argv, home / "imds.log", env={"HOME": str(home)})
    url = f"http://127.0.0.1:{port}"

    async def answers() -> bool:
        try:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
        except OSError:
            return False
        await stream.aclose()
        return True

    await wait.until(f"the metadata mock on port {port}", answers, 20.0)
    return Imds(url, proc, at)
