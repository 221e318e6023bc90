"""Secret hashes are keyed outside the store (tracemem/masking.py), and short secrets are masked too: real
stores, real key files, real runs."""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import stat

import pytest
from pydantic import BaseModel, SecretStr

from tracemem import Pipeline
from tracemem.errors import TracememError
from tracemem.masking import Masker
from tracemem.store import Store


class Pin(BaseModel):
    pin: SecretStr = SecretStr("")
    said: str = ""


def tell(s: Pin, ctx) -> None:
    ctx.log(f"the PIN is {s.pin.get_secret_value()}, order 41234, PIN123")
    s.said = f"ok {s.pin.get_secret_value()}."


FLOW = Pipeline("pin", Pin).then(tell).build()


@pytest.fixture
def config(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEMEM_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.delenv("TRACEMEM_SECRET_KEY", raising=False)
    return tmp_path / "config"


def hashed(store: Store, pin: str) -> str:
    return json.loads(FLOW.run({"pin": pin}, store=store).input_json)["pin"]["$redacted"]


def test_the_key_file_is_made_on_the_first_secret_owner_only_and_kept(config, tmp_path):
    class Plain(BaseModel):
        said: str = ""

    plain = Pipeline("plain", Plain).then(lambda s: None, id="noop").build()
    with Store(str(tmp_path / "a.duckdb")) as store:
        plain.run({}, store=store)  # a scope without secret fields: no key needed
        assert not (config / "secret-key").exists()
        first = hashed(store, "4821")
    key_file = config / "secret-key"
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600 and len(key_file.read_bytes().strip()) == 64
    with Store(str(tmp_path / "a.duckdb")) as store:  # reopened, same key: equal secrets hash equal
        assert hashed(store, "4821") == first
    key_file.write_bytes(b"another-machines-key\n")
    with Store(str(tmp_path / "a.duckdb")) as store:
        assert hashed(store, "4821") != first  # the key, not the file, decides


def test_a_fleet_shares_the_key_through_the_environment(config, tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEMEM_SECRET_KEY", "one-key-for-the-fleet")
    with Store(str(tmp_path / "a.duckdb")) as store:
        first = hashed(store, "4821")
    monkeypatch.setenv("TRACEMEM_CONFIG_DIR", str(tmp_path / "other-machine"))
    with Store(str(tmp_path / "a.duckdb")) as store:
        assert hashed(store, "4821") == first
    assert not (tmp_path / "other-machine").exists() and not config.exists()


def test_a_key_that_cannot_be_made_is_an_error_naming_the_way_out(config, tmp_path, monkeypatch):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the folder should be")
    monkeypatch.setenv("TRACEMEM_CONFIG_DIR", str(blocked))
    with Store(str(tmp_path / "a.duckdb")) as store:
        with pytest.raises(TracememError, match="TRACEMEM_SECRET_KEY"):
            FLOW.run({"pin": "4821"}, store=store)
        assert store.runs() == []  # nothing half-recorded


def test_a_store_written_before_keeps_working(config, tmp_path):
    """A store's old hashes were keyed by its salt alone; they stay readable, and new ones use the outside key."""
    path = str(tmp_path / "old.duckdb")
    with Store(path) as store:
        run_id = FLOW.run({"pin": "4821"}, store=store).run_id
        salt = bytes.fromhex(store.sql("SELECT value FROM tracemem_meta WHERE key = 'secret_salt'").fetchall()[0][0])
        legacy = "hmac-sha256:" + hmac.new(salt, b"4821", hashlib.sha256).hexdigest()[:32]
        store.flush()
        store.con.execute("UPDATE runs SET input = ? WHERE run_id = ?",
                          [json.dumps({"pin": {"$redacted": legacy}}), run_id])
    with Store(path) as store:
        run = store.run(run_id)
        assert json.loads(run.input_json)["pin"]["$redacted"] == legacy
        assert run.state_at().pin.get_secret_value() == "<redacted>"
        assert hashed(store, "4821") != legacy


def test_short_secrets_are_masked_where_they_stand_as_words(config, tmp_path):
    with Store(str(tmp_path / "a.duckdb")) as store:
        run = FLOW.run({"pin": "123"}, store=store)
        logs = store.sql("SELECT logs FROM steps WHERE run_id = ?", [run.run_id]).fetchall()[0][0]
        assert logs == ["the PIN is <redacted>, order 41234, PIN123"]
        said = store.sql("SELECT value FROM writes WHERE run_id = ? AND path = 'said'", [run.run_id]).fetchall()
        assert said == [('"ok <redacted>."',)]
    assert Masker(["x"]).text("x marks a box") == "<redacted> marks a box"
    assert Masker([""]).text("anything") == "anything" and not Masker([""])
