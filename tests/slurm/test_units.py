"""The plugin's pure parts: comment tags, squeue/sacct parsing, state and error mapping, config, the job script."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "providers" / "slurm"))

from slurm_plugin import jobs, slurmcli, submit  # noqa: E402
from slurm_plugin import tags as tagmod  # noqa: E402
from slurm_plugin.config import Config  # noqa: E402

from provisionerd.plugin_sdk.config import ConfigInvalid  # noqa: E402
from provisionerd.plugin_sdk.errors import PluginError  # noqa: E402

texts = st.text(min_size=1, max_size=40)


@given(st.dictionaries(texts, st.text(max_size=40), max_size=6), texts)
def test_tags_survive_the_comment_and_never_break_a_squeue_line(extra: dict[str, str], cluster: str) -> None:
    tags = {**extra, tagmod.CLUSTER: cluster}
    comment = tagmod.encode(tags)
    assert tagmod.decode(comment) == tags
    assert "|" not in comment and "\n" not in comment and "\r" not in comment
    assert comment.count(" ") == len(tags)  # one space per pair: no value can add a word


@pytest.mark.parametrize(
    "comment",
    [
        "(null)",
        "",
        "a=b",
        "provisionerd-v1",
        "provisionerd-v1 x",
        "provisionerd-v1 provisionerd:provider=slurm",  # no cluster tag
        "provisionerd-v1 provisionerd:cluster=c a=b=c",
        "provisionerd-v1 provisionerd:cluster=%ff",  # not UTF-8
        "provisionerd-v1  provisionerd:cluster=c",
    ],
)
def test_a_comment_we_did_not_write_is_not_ours(comment: str) -> None:
    assert tagmod.decode(comment) is None


def test_squeue_lines_parse_and_a_pipe_in_a_foreign_comment_shifts_nothing() -> None:
    ours = tagmod.encode({tagmod.CLUSTER: "c|1", tagmod.OP: "op", tagmod.INSTANCE: "i 0"})
    text = "\n".join(
        [
            f"12|RUNNING|None|0|1700000000|1700000003|1:59|n1|{ours}|",
            "13|FAILED|NonZeroExitCode|768|1700000000|1700000003|INVALID|n2|(null)|",
            "14|PENDING|Resources|0|1700000000|N/A|1-00:00:00||a|b|c|",
            "15|CANCELLED|None|9|1700000000|1700000001|0:00|n1|x|",
            "garbage line",
            "|||",
        ]
    )
    records = {r.job_id: r for r in jobs.parse_squeue(text)}
    assert set(records) == {"12", "13", "14", "15"}
    assert records["12"].tags == {tagmod.CLUSTER: "c|1", tagmod.OP: "op", tagmod.INSTANCE: "i 0"}
    assert (records["12"].start_time, records["12"].time_left, records["12"].nodes) == (1700000003, 119, "n1")
    assert (records["13"].exit_code, records["13"].signal, records["13"].tags) == (3, 0, None)
    assert (records["14"].start_time, records["14"].time_left, records["14"].tags) == (None, 86400, None)
    assert (records["15"].exit_code, records["15"].signal) == (0, 9)


def test_sacct_lines_parse() -> None:
    found = jobs.parse_sacct("7|CANCELLED by 0|0:15\n8|FAILED|2:0\nbad\n")
    assert (found["7"].state, found["7"].signal, found["7"].source) == ("CANCELLED", 15, "accounting")
    assert (found["8"].state, found["8"].exit_code) == ("FAILED", 2)


@pytest.mark.parametrize(
    "text,seconds",
    [
        ("1:59", 119),
        ("2:00:00", 7200),
        ("3-01:00:00", 262800),
        ("45", 45),
        ("UNLIMITED", None),
        ("NOT_SET", None),
        ("INVALID", None),
        ("1:x", None),
    ],
)
def test_durations(text: str, seconds: int | None) -> None:
    assert jobs.parse_duration(text) == seconds


def _record(state: str, **kw: object) -> jobs.JobRecord:
    return jobs.JobRecord(job_id="5", state=state, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "record,returned,expected",
    [
        (_record("PENDING", reason="Priority"), False, ("executing", "pending", "job 5 is queued in Slurm (Priority)")),
        (_record("CONFIGURING"), False, ("executing", "pending", "job 5 is queued in Slurm")),
        (_record("RUNNING", nodes="n1"), False, ("succeed", "running", "job 5 is running on n1")),
        (
            _record("FAILED", exit_code=2, signal=0),
            False,
            ("fail", "terminated", "failed: job 5: the pilot job failed, exit code 2"),
        ),
        (
            _record("FAILED", exit_code=0, signal=9),
            False,
            ("fail", "terminated", "failed: job 5: the pilot job failed, killed by signal 9"),
        ),
        (_record("CANCELLED"), False, ("fail", "terminated", "cancelled: job 5: cancelled outside provisionerd")),
        (_record("CANCELLED"), True, ("succeed", "terminated", "job 5 was returned (CANCELLED)")),
        (
            _record("NODE_FAIL"),
            False,
            ("fail", "terminated", "node_fail: job 5: the node running the pilot job failed"),
        ),
        (_record("TIMEOUT"), False, ("fail", "terminated", "timeout: job 5: the pilot job reached its time limit")),
        (_record("PREEMPTED"), False, ("fail", "terminated", "preempted: job 5: the pilot job was preempted")),
        (
            _record("COMPLETING", exit_code=2, signal=0),
            False,
            ("fail", "terminated", "failed: job 5: the pilot job failed, exit code 2"),
        ),
        (
            _record("COMPLETING", exit_code=0, signal=0),
            False,
            ("fail", "terminated", "completing: job 5: the pilot job is ending on its own"),
        ),
        (
            _record("COMPLETED", exit_code=0),
            False,
            ("fail", "terminated", "completed: job 5: the pilot job ended on its own, exit code 0"),
        ),
        (_record("SOMETHING_NEW"), False, ("executing", "something_new", "job 5 is in Slurm state SOMETHING_NEW")),
        (None, False, ("fail", "unknown", "gone: job 5 is known neither to slurmctld nor to accounting")),
        (None, True, ("succeed", "terminated", "job 5 was returned and is gone from Slurm")),
    ],
)
def test_job_states_map_to_typed_outcomes(record: jobs.JobRecord | None, returned: bool, expected: tuple) -> None:
    out = jobs.outcome("5", record, returned)
    assert (out.result, out.status, out.message) == expected


def test_the_returned_marker_in_the_comment_counts_like_our_own_record() -> None:
    marked = _record("CANCELLED", tags={tagmod.CLUSTER: "c", tagmod.RETURNED: "r1"})
    assert jobs.outcome("5", marked, False).result == "succeed"
    assert jobs.reclaim_reason(marked, False, 300) is None
    assert jobs.reclaim_reason(_record("CANCELLED", tags={tagmod.CLUSTER: "c"}), False, 300) == ("cancelled", 0)
    assert jobs.reclaim_reason(_record("RUNNING", time_left=200), False, 300) == ("time_limit", 200)
    assert jobs.reclaim_reason(_record("RUNNING", time_left=400), False, 300) is None
    assert jobs.reclaim_reason(_record("RUNNING"), False, 300) is None  # unlimited
    assert jobs.reclaim_reason(None, False, 300) == ("gone", 0)
    # A pilot that exited nonzero is "failed" from its COMPLETING moment on, not first "completing".
    assert jobs.reclaim_reason(_record("COMPLETING", exit_code=2, tags={tagmod.CLUSTER: "c"}), False, 300) == (
        "failed",
        0,
    )


@pytest.mark.parametrize(
    "stderr,code",
    [
        ("slurm_load_jobs error: Unable to contact slurm controller (connect failure)", "throttled"),
        ("sbatch: error: Batch job submission failed: Socket timed out on send/recv operation", "throttled"),
        (
            "sbatch: error: Slurm temporarily unable to accept job, sleeping and retrying\n"
            "sbatch: error: Batch job submission failed: Resource temporarily unavailable",
            "throttled",
        ),
        ('sbatch: error: Munge encode failed: Failed to access "/run/munge/munge.socket.2"', "throttled"),
        (
            "sbatch: error: CPU count per node can not be satisfied\n"
            "sbatch: error: Batch job submission failed: Requested node configuration is not available",
            "invalid_request",
        ),
        (
            "sbatch: error: invalid partition specified: x\n"
            "sbatch: error: Batch job submission failed: Invalid partition name specified",
            "invalid_request",
        ),
        (
            "sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified",
            "invalid_request",
        ),
        ("sbatch: error: Invalid generic resource (gres) specification", "invalid_request"),
        (
            "sbatch: error: Batch job submission failed: Required partition not available (inactive or drain)",
            "capacity_unavailable",
        ),
        (
            "sbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit, user's "
            "size and/or time limits)",
            "quota_exceeded",
        ),
        ("sbatch: error: Batch job submission failed: Access/permission denied", "auth_failed"),
        ("sbatch: error: Batch job submission failed: Protocol authentication error", "auth_failed"),
        ("sbatch: error: something entirely new", "provider_error"),
    ],
)
def test_slurm_error_texts_map_to_contract_codes(stderr: str, code: str) -> None:
    assert slurmcli.classify(stderr) == code


@pytest.mark.process
def test_a_command_that_hangs_is_throttled_and_says_a_retry_is_safe(tmp_path: Path) -> None:
    sleeper = tmp_path / "sbatch"
    sleeper.write_text("#!/bin/sh\nexec sleep 5\n")
    sleeper.chmod(0o755)
    cmd = slurmcli.SlurmCommands(timeout=0.3, bin_dir=str(tmp_path))
    with pytest.raises(PluginError) as caught:
        cmd.run("sbatch", [], mutating=True)
    assert caught.value.code == "throttled" and caught.value.retryable
    assert (
        "did not finish within 0.3 s" in caught.value.message and "a retry with the same op_id" in caught.value.message
    )
    with pytest.raises(PluginError) as missing:
        cmd.run("squeue", [])
    assert missing.value.code == "provider_error" and "not installed" in missing.value.message


def _config(**template: object) -> dict:
    return {
        "partition": "p",
        "workdir": "/w",
        "agent": {"certs": "/c"},
        "templates": [{"templateId": "t", "maxNumber": 2, "cpus": 4, **template}],
    }


def test_config_derives_lsf_attributes_and_keeps_a_documented_price() -> None:
    price = {
        "amount": 0.5,
        "currency": "EUR",
        "unit": "hour",
        "source": "site table",
        "timestamp": "2024-07-01T00:00:00Z",
    }
    config = Config.from_document(
        _config(memMB=8000, gres="gpu:a100:2", price=price, attributes={"x": ["Boolean", "1"]})
    )
    doc = config.templates["t"].as_contract()
    assert doc["attributes"] == {
        "type": ["String", "X86_64"],
        "ncpus": ["Numeric", "4"],
        "ngpus": ["Numeric", "2"],
        "mem": ["Numeric", "8000"],
        "x": ["Boolean", "1"],
    }
    assert doc["price"] == price and doc["maxNumber"] == 2
    assert config.templates["t"].resource_args() == [
        "--nodes=1",
        "--ntasks=1",
        "--cpus-per-task=4",
        "--mem=8000",
        "--gres=gpu:a100:2",
    ]
    assert config.agent_command[1:] == ("-m", "provisionerd", "agent")
    assert "price" not in Config.from_document(_config()).templates["t"].as_contract()


@pytest.mark.parametrize(
    "doc,words",
    [
        ({"partition": "p"}, "required property"),
        (_config(sbatchArgs=["--comment=x"]), "the plugin sets"),
        (_config(sbatchArgs=["--export=ALL"]), "the plugin sets"),
        (
            _config(price={"amount": 1, "currency": "USD", "unit": "hour", "source": "s", "timestamp": "yesterday"}),
            "is not a 'date-time'",
        ),
        (
            _config(price={"amount": 1, "currency": "USD", "unit": "hour", "timestamp": "2024-07-01T00:00:00Z"}),
            "'source' is a required property",
        ),
        ({**_config(), "templates": [_config()["templates"][0]] * 2}, "duplicate templateId"),
        ({**_config(), "workdir": "relative"}, "workdir"),
        (_config(timeLimit="1 hour"), "timeLimit"),
    ],
)
def test_a_bad_config_is_a_provider_error_naming_the_problem(doc: dict, words: str) -> None:
    """A broken configuration is the plugin's set-up, not the daemon's request: ``provider_error``
    (``plugin_sdk.config.CONTRACT_CODE``), as in every shipped plugin."""
    with pytest.raises(ConfigInvalid) as caught:
        Config.from_document(doc)
    assert caught.value.code == "provider_error" and words in caught.value.message


def test_the_job_script_names_the_token_file_and_quotes_everything(tmp_path: Path) -> None:
    config = Config.from_document(_config())
    boot = {"instanceRef": "it's $(rm -rf /) `x`", "controllers": ["a:1", "b:2"], "joinToken": "SECRET-TOKEN-123456"}
    script = submit.job_script(config, config.templates["t"], boot, tmp_path / "k.token")
    line = script.splitlines()[-1]
    argv = shlex.split(line)
    assert argv[0] == "exec" and argv[argv.index("--instance-ref") + 1] == boot["instanceRef"]
    assert argv[argv.index("--controllers") + 1] == "a:1,b:2"
    assert argv[argv.index("--token-file") + 1] == str(tmp_path / "k.token")
    assert "SECRET" not in script
    submit.write_token(tmp_path / "k.token", "SECRET-TOKEN-123456")
    submit.write_token(tmp_path / "k.token", "SECRET-TOKEN-654321")  # a stale file is replaced, not appended
    assert (tmp_path / "k.token").read_text() == "SECRET-TOKEN-654321"
    assert (tmp_path / "k.token").stat().st_mode & 0o777 == 0o600


@given(st.sampled_from(["req", "ret"]), texts, st.from_regex(r"[A-Za-z0-9._:-]{1,64}", fullmatch=True))
def test_request_ids_split_back(kind: str, cluster: str, op_id: str) -> None:
    request_id = submit.request_id_for(kind, cluster, op_id)
    assert submit.parse_request_id(request_id) == (kind, tagmod.cluster_hash(cluster), op_id)


def test_foreign_request_ids_are_not_ours() -> None:
    assert submit.parse_request_id("aws-123") is None
    assert submit.parse_request_id("slurm-req@abc@") is None


@given(ids=st.sets(st.integers(1, 10**7), max_size=60), size=st.integers(1, 70))
def test_job_pages_join_up_in_job_id_order(ids: set[int], size: int) -> None:
    from slurm_plugin.status import keyset_page

    entries = [{"machineId": str(i)} for i in ids]
    pages, doc = [], {"pageSize": size}
    while True:
        page, more = keyset_page(entries, doc)
        pages.append(page)
        if not more:
            break
        doc = {"pageSize": size, "cursor": more["nextCursor"]}
    joined = [int(e["machineId"]) for page in pages for e in page]
    assert joined == sorted(ids) and all(len(p) <= size for p in pages)  # numeric order, each once, none missing
    with pytest.raises(PluginError, match="cursor"):
        keyset_page(entries, {"pageSize": 1, "cursor": "x9"})


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30", 1800), ("30:15", 1815), ("1:00:00", 3600), ("2-0", 172800), ("1-02:03", 93780), ("1-0:0:5", 86405)],
)
def test_slurm_times_read_back_in_seconds(text: str, seconds: float) -> None:
    assert submit.slurm_seconds(text) == seconds
    assert submit.slurm_seconds("UNLIMITED") == float("inf")


def test_a_pilot_job_carries_max_ttl_as_its_time_limit_unless_the_template_is_shorter(tmp_path: Path) -> None:
    def times(config: Config, lifetime: float) -> list[str]:
        args = submit.sbatch_args(config, config.templates["t"], {tagmod.CLUSTER: "c"}, "k", lifetime)
        return [a for a in args if a.startswith("--time")]

    plain = Config.from_document(_config())
    assert times(plain, 0) == [] and times(plain, 3600) == ["--time=60"] and times(plain, 61) == ["--time=2"]
    capped = Config.from_document(_config(timeLimit="30"))  # 30 minutes: shorter than a 1 h max_ttl
    assert times(capped, 3600) == ["--time=30"] and times(capped, 600) == ["--time=10"]


def test_the_pilot_agent_learns_the_orphan_timeout(tmp_path: Path) -> None:
    config = Config.from_document(_config())
    boot = {"instanceRef": "i", "controllers": ["a:1"], "joinToken": "SECRET-TOKEN-123456"}
    assert "--orphan-timeout" not in submit.job_script(config, config.templates["t"], boot, tmp_path / "k.token")
    argv = shlex.split(
        submit.job_script(
            config, config.templates["t"], {**boot, "orphanTimeout": 600}, tmp_path / "k.token"
        ).splitlines()[-1]
    )
    assert argv[argv.index("--orphan-timeout") + 1] == "600"
    argv = shlex.split(
        submit.job_script(
            config, config.templates["t"], {**boot, "orphanTimeout": 1}, tmp_path / "k.token"
        ).splitlines()[-1]
    )
    assert argv[argv.index("--orphan-timeout") + 1] == "15"  # never below the agent's reply timeout
