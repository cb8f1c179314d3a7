"""Row checksums (``refcontroller.store_rows``): a byte flipped in any row of a small store gives a one-line refusal
at open, or a typed storage fault at run time, never a traceback, an undetected change or "internal error".

The flips are made the way a disk or a hand edit would leave them, below the store's own code: on a raw SQLite
connection, with the table's checksum triggers dropped for the write (and put back in the same transaction), so
the value changes and its checksum does not.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rc_client import granted, joined_provisioner, memory_controller, on_mock_clock
from rc_factories import FakeElection, FakeEtcd, before_row_checksums, instance, intent, item, sha
from rigs import controller, procs

from provisionerd.domain.model import DemandSnapshot, Epoch, Returned
from provisionerd.wire.messages import FactAck, FactCommit, Rejected, ResyncPage, ResyncRequest
from refcontroller import store_full, store_rows
from refcontroller.store import FactStore, StoreRefused, read_history
from refcontroller.store_etcd import EtcdFactStore

E = Epoch(1, 1)
#: The tables read back at run time with their checksum (the lifecycle tables are checked at every open only).
CHECKED_AT_RUN_TIME = (
    "facts",
    "fact_times",
    "meta",
    "token_claims",
    "used_tokens",
    "rejoin_hashes",
    "worker_credentials",
)
#: The columns a read looks rows up by: a flip there hides the row from the read that would have met it (it is
#: found at the next open, which checks every row).
LOOKUP_COLUMNS = {
    ("meta", "key"),
    ("facts", "provider"),
    ("facts", "ended_at"),
    ("fact_times", "idx"),
    ("token_claims", "token_hash"),
    ("token_claims", "instance_ref"),
    ("token_claims", "machine_id"),
    ("used_tokens", "token_hash"),
    ("rejoin_hashes", "instance_ref"),
    ("rejoin_hashes", "rejoin_hash"),
    ("worker_credentials", "instance_ref"),
}


def small_store(path: Path) -> None:
    """Two providers' facts (intent, instances, a return; all but one with their commit time), the term, a demand,
    grantees, spent tokens with credentials (one delivered, one revoked) and a rejoin proof: a row in every table."""
    store = FactStore.open(path, incarnation="inc-rows")
    store.save_term(3)
    store.save_demand(DemandSnapshot(4, (item("d1", 2),)))
    store.save_grantee("aws", "d1#1")
    store.append(intent("aws", E, "op-1", ("i-1", "i-2")), "d1#1", 1_765_000_000.25)
    store.append(instance("aws", E, "i-1", "op-1"), "d1#1", 1_765_000_001.5)
    store.append(instance("aws", E, "i-2", "op-1"), "d1#1")  # its time not known: no fact_times row
    store.append(Returned(provider="aws", epoch=E, op_id="ret-1", machine_ids=("m-i-2",)), "d1#1", 1_765_000_002.0)
    store.append(intent("gcp", E, "op-9", ("g-1",)), "d2#1", 1_765_000_003.75)
    store.use_token(sha("tok-i-1"), "i-1", 10.0, rejoin_hash="r" * 64, credential_hash="c" * 64)
    store.use_token(sha("tok-g-1"), "g-1", 11.5, credential_hash="d" * 64)
    store.credential_delivered("i-1", 12.25)
    store.revoke_credential("g-1", "lost", 13.0)
    store.close()


def everything(store: FactStore) -> Any:
    """What the controller reads back from a store, as plain values: equal for stores that answer the same."""
    refs = ("i-1", "i-2", "g-1")
    return (
        store.incarnation,
        store.load_term(),
        store.load_demand(),
        [store.last_grantee(p) for p in ("aws", "gcp")],
        list(store.all_facts()),
        store.facts(["aws", "gcp"], 1, 100, as_of=100),
        store.history("aws"),
        store.history_rows(None, 0, 100, 100),
        store.latest("aws"),
        store.latest_epochs(),
        [store.credential(r) for r in refs],
        [store.token_claims(sha(f"tok-{r}")) for r in refs],
        [store.instance_claims(r) for r in refs],
        store.machine_claims("m-i-1"),
        store.rejoin_token_hash("i-1", "r" * 64),
        [store.instance_ended(r) for r in refs],
        store.credential_counts(),
        store.live_count(),
        store.last_index(),
    )


def flips(conn: sqlite3.Connection, tables: tuple[str, ...] = tuple(store_rows.TABLES)) -> Iterator[Any]:
    """Every ``(table, rowid, column, original, flipped)``: each byte of each stored value (text as its UTF-8 bytes,
    integers as their 8 bytes, reals as their IEEE 754 bytes, the checksum included) with its lowest bit flipped."""
    for table in tables:
        columns = [name for name, _ in store_rows.TABLES[table]] + ["rowsum"]
        for rowid, *values in conn.execute(f"SELECT rowid, {', '.join(columns)} FROM {table}").fetchall():
            for column, value in zip(columns, values, strict=True):
                for flipped in flipped_values(value):
                    yield table, rowid, column, value, flipped


def flipped_values(value: Any, mask: int = 0x01) -> Iterator[Any]:
    if isinstance(value, str):
        raw = value.encode()
        for i in range(len(raw)):
            changed = raw[:i] + bytes([raw[i] ^ mask]) + raw[i + 1 :]
            try:
                yield changed.decode()
            except UnicodeDecodeError:
                yield changed  # stored as a blob: text that no longer decodes
    elif isinstance(value, bool | int):
        for i in range(8 if value > 0xFFFFFFFF or value < 0 else 4):
            yield value ^ (mask << (8 * i))
    elif isinstance(value, float):
        raw = struct.pack(">d", value)
        for i in range(8):
            flipped = struct.unpack(">d", raw[:i] + bytes([raw[i] ^ mask]) + raw[i + 1 :])[0]
            if flipped != value:  # 0.0 -> -0.0 is the same number: no change (SQLite stores and reads it as 0.0)
                yield flipped


def write_raw(conn: sqlite3.Connection, table: str, rowid: int, column: str, value: Any) -> bool:
    """Set one stored value below the store's code: its checksum stays as it was. ``False`` (nothing written) when
    the value would collide with another row's key: no single flip inside one row leaves such a file."""
    triggers = [
        sql
        for (sql,) in conn.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = ? AND name LIKE '%rowsum%'", (table,)
        )
    ]
    conn.execute("BEGIN IMMEDIATE")
    for name in (f"{table}_rowsum_insert", f"{table}_rowsum_update"):
        conn.execute(f"DROP TRIGGER IF EXISTS {name}")
    try:
        conn.execute(f"UPDATE {table} SET {column} = ? WHERE rowid = ?", (value, rowid))
    except sqlite3.IntegrityError:
        conn.execute("ROLLBACK")
        return False
    for sql in triggers:
        conn.execute(sql)
    conn.execute("COMMIT")
    return True


def moved(table: str, column: str, rowid: int, value: Any) -> int:
    """The row's rowid after ``column`` was set to ``value`` (``facts.idx`` and ``fact_times.idx`` are the rowid)."""
    return value if (table, column) in (("facts", "idx"), ("fact_times", "idx")) else rowid


def raw_connection(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous=OFF")
    return conn


@pytest.mark.sweep
def test_every_byte_flipped_in_every_row_is_refused_at_open_in_one_line_naming_table_and_row(tmp_path: Path) -> None:
    path = tmp_path / "facts.sqlite"
    small_store(path)
    baseline = FactStore.open(path)
    expected = everything(baseline)
    baseline.close()
    conn = raw_connection(path)
    outcomes = {"refused": 0, "no change": 0, "collides": 0}
    by_table: dict[str, int] = {}
    for table, rowid, column, original, flipped in list(flips(conn)):
        if not write_raw(conn, table, rowid, column, flipped):
            outcomes["collides"] += 1
            continue
        try:
            store = FactStore.open(path)
        except StoreRefused as exc:
            message = str(exc)
            assert "\n" not in message and f"of table {table} " in message, message
            assert "fails its checksum" in message or "cannot be read" in message, message
            outcomes["refused"] += 1
        else:
            try:
                assert everything(store) == expected, (table, rowid, column, flipped)
            finally:
                store.close()
            outcomes["no change"] += 1
        by_table[table] = by_table.get(table, 0) + 1
        assert write_raw(conn, table, moved(table, column, rowid, flipped), column, original)
    conn.close()
    print(f"flips: {sum(outcomes.values())} ({outcomes}); per table: {by_table}")
    assert set(by_table) == set(store_rows.TABLES)  # a row of every table was flipped
    assert outcomes["refused"] > 2000
    reopened = FactStore.open(path)  # every flip undone: the store opens as it was
    assert everything(reopened) == expected
    reopened.close()


@pytest.mark.sweep
def test_a_byte_flipped_while_serving_is_a_typed_storage_fault_at_the_next_read(tmp_path: Path) -> None:
    path = tmp_path / "facts.sqlite"
    small_store(path)
    store = FactStore.open(path)
    expected = everything(store)
    conn = raw_connection(path)
    faults = unchanged = hidden = 0
    for table, rowid, column, original, flipped in list(flips(conn, CHECKED_AT_RUN_TIME)):
        if not write_raw(conn, table, rowid, column, flipped):
            continue
        try:
            seen = everything(store)
        except store_rows.StoreCorrupt as exc:
            assert exc.table == table and "\n" not in str(exc)
            faults += 1
        else:
            if seen != expected:
                assert (table, column) in LOOKUP_COLUMNS, (table, rowid, column, flipped)
                hidden += 1
            else:
                unchanged += 1
        assert write_raw(conn, table, moved(table, column, rowid, flipped), column, original)
    conn.close()
    print(
        f"run-time flips: {faults + unchanged + hidden} ({faults} typed faults, {unchanged} no change, {hidden} in"
        " a lookup column: the row not met)"
    )
    assert faults > 1000
    store.close()


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "facts.sqlite"
    small_store(path)
    return path


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_bit_of_any_row_flipped_is_refused(
    template: Path, tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    """The exhaustive test flips the lowest bit; here any bit, in rows hypothesis picks."""
    path = tmp_path_factory.mktemp("bits") / "facts.sqlite"
    for source in (template, template.with_name(template.name + ".mark")):  # the store closed: no -wal left
        shutil.copy(source, path.with_name(source.name))
    conn = raw_connection(path)
    table = data.draw(st.sampled_from(sorted(store_rows.TABLES)))
    rows = [r for (r,) in conn.execute(f"SELECT rowid FROM {table}")]
    rowid = data.draw(st.sampled_from(rows))
    column = data.draw(st.sampled_from([name for name, _ in store_rows.TABLES[table]] + ["rowsum"]))
    (value,) = conn.execute(f"SELECT {column} FROM {table} WHERE rowid = ?", (rowid,)).fetchone()
    candidates = list(flipped_values(value, 1 << data.draw(st.integers(0, 7))))
    if not candidates:  # an empty text: nothing to flip
        return
    if not write_raw(conn, table, rowid, column, data.draw(st.sampled_from(candidates))):
        return
    conn.close()
    with pytest.raises(StoreRefused, match=f"of table {table} "):
        FactStore.open(path).close()


@on_mock_clock
async def test_a_resync_over_a_flipped_fact_answers_storage_failure_and_keeps_the_link(tmp_path: Path) -> None:
    async with memory_controller(tmp_path, replicas=1) as h:
        peer = await joined_provisioner(h)
        await trio.sleep(35.0)  # a new controller's grace (ttl + check): no lease before it ends
        epoch = await granted(peer)
        ack = await peer.request(FactCommit(intent("aws", epoch, "op-1", ("i-1",))))
        assert isinstance(ack, FactAck)
        conn = raw_connection(tmp_path / "facts.sqlite")
        (body,) = conn.execute("SELECT body FROM facts WHERE idx = ?", (ack.index,)).fetchone()
        write_raw(conn, "facts", ack.index, "body", body.replace('"op-1"', '"op-2"'))
        conn.close()
        reply = await peer.request(ResyncRequest(("aws",)))
        assert isinstance(reply, Rejected) and reply.reason == "storage_failure", reply
        assert f"row {ack.index} of table facts fails its checksum" in reply.detail
        # The link is kept: the next request is answered, and nothing counted as an internal error.
        conn = raw_connection(tmp_path / "facts.sqlite")
        write_raw(conn, "facts", ack.index, "body", body)
        conn.close()
        page = await peer.request(ResyncRequest(("aws",)))
        assert isinstance(page, ResyncPage) and [f.index for f in page.facts] == [ack.index]
        status = h.server.status()
        assert h.server.stats["internal_errors"] == 0 and status["storage_failures"] == 1
        await trio.lowlevel.checkpoint()


def test_the_history_command_refuses_a_flipped_fact_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "facts.sqlite"
    small_store(path)
    assert len(read_history(path, "aws")) == 4
    conn = raw_connection(path)
    (idx, body) = conn.execute("SELECT idx, body FROM facts WHERE provider = 'aws' ORDER BY idx LIMIT 1").fetchone()
    assert write_raw(conn, "facts", idx, "body", body.replace("op-1", "op-3"))
    conn.close()
    with pytest.raises(StoreRefused, match=f"is damaged: row {idx} of table facts fails its checksum"):
        read_history(path, "aws")


def test_a_store_from_before_checksums_is_summed_once_then_checked(tmp_path: Path) -> None:
    path = tmp_path / "facts.sqlite"
    small_store(path)
    conn = raw_connection(path)
    before_row_checksums(conn)
    conn.close()
    upgraded = FactStore.open(path)
    expected = everything(upgraded)
    upgraded.close()
    conn = raw_connection(path)
    assert conn.execute("SELECT count(*) FROM facts WHERE rowsum IS NULL").fetchone()[0] == 0
    write_raw(conn, "meta", 1, "value", "inc-rowz")
    conn.close()
    with pytest.raises(StoreRefused, match="of table meta fails its checksum"):
        FactStore.open(path)
    conn = raw_connection(path)
    write_raw(conn, "meta", 1, "value", "inc-rows")
    conn.close()
    again = FactStore.open(path)
    assert everything(again) == expected
    again.close()


def test_a_full_disk_at_open_is_reported_as_full_not_damaged(tmp_path: Path) -> None:
    class Full:
        f_bavail, f_frsize = 3, 4096

    error = sqlite3.OperationalError("disk I/O error")
    message = store_full.describe_open_failure(tmp_path / "facts.sqlite", error, lambda _: Full())  # type: ignore[arg-type, return-value]
    assert "the disk is full (12288 bytes available" in message and "damaged" not in message
    assert "\n" not in message

    class Roomy:
        f_bavail, f_frsize = 1 << 20, 4096

    roomy = store_full.describe_open_failure(tmp_path / "facts.sqlite", error, lambda _: Roomy())  # type: ignore[arg-type, return-value]
    assert roomy.endswith("is damaged: disk I/O error")
    assert store_full.is_full(tmp_path, OSError(28, "No space left on device"), lambda _: Roomy())  # type: ignore[arg-type, return-value]


# --- the etcd store: the same check on its log entries -----------------------------------------------------------


def etcd_store(etcd: FakeEtcd) -> EtcdFactStore:
    return EtcdFactStore.replay(etcd, FakeElection())  # type: ignore[arg-type]


@pytest.mark.sweep
def test_every_byte_flipped_in_an_etcd_log_entry_is_refused_or_changes_nothing() -> None:
    etcd = FakeEtcd()
    store = etcd_store(etcd)
    store.save_demand(DemandSnapshot(2, (item("d1", 1),)))
    store.save_grantee("aws", "d1#1")
    store.append(intent("aws", E, "op-1", ("i-1",)), "d1#1")
    store.use_token(sha("tok-i-1"), "i-1", 10.5, credential_hash="c" * 64)
    expected = everything(store)
    store.close()
    entries = sorted(k for k in etcd.kv if b"/ops/0" in k)
    outcomes = {"refused": 0, "no change": 0}
    for key in entries:
        original = etcd.kv[key]
        for i in range(len(original)):
            etcd.kv[key] = original[:i] + bytes([original[i] ^ 0x01]) + original[i + 1 :]
            try:
                replayed = etcd_store(etcd)
            except StoreRefused as exc:
                assert "\n" not in str(exc) and "entry" in str(exc)
                outcomes["refused"] += 1
            else:
                assert everything(replayed) == expected, (key, i)
                replayed.close()
                outcomes["no change"] += 1
        etcd.kv[key] = original
    print(f"etcd flips: {sum(outcomes.values())} ({outcomes})")
    assert outcomes["refused"] > 0.9 * sum(outcomes.values())
    assert json.loads(etcd.kv[entries[0]])["sum"] > 0


# --- real processes ----------------------------------------------------------------------------------------------


def refused_in_one_line(certs: Path, data: Path) -> str:
    done = procs.run(controller.serve_argv(certs, data), timeout=60)
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("refcontroller: store "), done.stderr
    assert "Traceback" not in done.stderr
    return lines[0]


@pytest.mark.process
def test_serve_refuses_a_flipped_demand_row_in_one_line_and_exits_2(certs: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    with controller.serving(certs, data, tmp_path / "serve.log") as served:
        items = '[{"demand_id": "d", "shape": {"ncpus": 1}, "count": 2}]'
        argv = procs.refcontroller("admin", "--certs", certs, "--connect", served.address, "demand", "--file", "-")
        assert procs.run(argv, input=items, timeout=60).returncode == 0
        served.process.send_signal(signal.SIGTERM)
        assert served.process.wait(timeout=30) == 0
    conn = raw_connection(data / "facts.sqlite")
    (rowid, value) = conn.execute("SELECT rowid, value FROM meta WHERE key = 'demand_items'").fetchone()
    k = len(value) // 2
    assert write_raw(conn, "meta", rowid, "value", value[:k] + chr(ord(value[k]) ^ 1) + value[k + 1 :])
    conn.close()
    line = refused_in_one_line(certs, data)
    assert "row 'demand_items' of table meta fails its checksum" in line, line


@pytest.mark.process
def test_serve_on_a_full_disk_says_the_disk_is_full(certs: Path, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
        try:  # every block taken
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        line = refused_in_one_line(certs, disk / "data")
        assert "the disk is full" in line and "damaged" not in line, line
    finally:
        subprocess.run(["umount", str(disk)], check=True)
