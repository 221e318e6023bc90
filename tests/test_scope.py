"""The typed scope: reads with sources, validated writes, recorded mutation verbs, secrets."""
from __future__ import annotations

import functools
import json
from typing import Annotated, Any, Optional

import pytest
from pydantic import BaseModel, Field, SecretStr

from tracemem import Pipeline, RunFailed, ScopeReadError, ScopeWriteError


class Profile(BaseModel):
    name: str = ""
    tags: list[str] = []


class Msg(BaseModel):
    role: str
    content: str


class S(BaseModel):
    n: int = 0
    text: str = ""
    items: list[int] = []
    d: dict[str, int] = {}
    msgs: list[dict[str, Any]] = []
    chat: list[Msg] = []
    profile: Profile = Profile()
    maybe: Optional[int] = None
    api_key: SecretStr = SecretStr("")


def run1(fn, inputs=None, **kw):
    """Run a one-stage pipeline; return the run."""
    return Pipeline("p", S).then(fn, id="st").build().run(inputs or {}, **kw)


def writes(run, step=None):
    return [(w.path, w.verb, None if w.value is None else json.loads(w.value))
            for w in run.writes if step is None or w.step == step]


def assert_replays(run):
    """Replaying the write log reproduces the final scope (secrets aside)."""
    assert run.state_at().model_dump(exclude={"api_key"}) == run.output.model_dump(exclude={"api_key"})


# -- reads -------------------------------------------------------------------------


def test_reads_record_source_input_then_step():
    def a(s):
        s.n = s.n + 1

    def b(s):
        s.text = str(s.n) + s.text

    run = Pipeline("p", S).then(a).then(b).build().run({"n": 1, "text": "!"})
    assert run.output.text == "2!"
    reads = {(r.step, r.path): (r.source_step, r.source_seq) for r in run.reads}
    assert reads[(1, "n")] == (None, None)  # run input
    assert reads[(2, "n")] == (1, run.writes[0].seq)  # the write of step 1
    assert reads[(2, "text")] == (None, None)


def test_repeated_read_recorded_once_and_own_write_is_source():
    def a(s):
        _ = s.n, s.n, s.n
        s.n = 5
        s.text = str(s.n)

    run = run1(a)
    reads = [(r.path, r.source_step, r.source_seq) for r in run.reads]
    assert reads == [("n", None, None), ("n", 1, 2)]  # second source: the stage's own write (seq 2)


def test_read_unknown_field():
    def a(s):
        return s.nope

    run = run1(a, raise_on_error=False)
    assert run.status == "failed"
    assert "read 'nope'" in run.error and "st" in run.error
    caught = {}

    def b(s):
        try:
            s.nope  # noqa: B018
        except ScopeReadError as err:  # also an AttributeError: getattr(scope, name, default) works
            caught["err"] = err
        caught["default"] = getattr(s, "nope", "dflt")

    run1(b)
    assert isinstance(caught["err"], AttributeError) and "fields: n, text" in str(caught["err"])
    assert caught["default"] == "dflt"


# -- writes --------------------------------------------------------------------


def test_write_is_validated_and_coerced():
    def a(s):
        s.n = "7"  # pydantic lax mode coerces

    run = run1(a)
    assert run.output.n == 7 and writes(run) == [("n", "set", 7)]


class Plain(BaseModel):
    n: int = 0
    big: int = 0
    flag: bool = False
    ratio: float = 0.0
    text: str = ""
    positive: Annotated[int, Field(gt=0)] = 1  # constrained: never written unvalidated
    short: Annotated[str, Field(max_length=3)] = ""


def _set(s: Any, field: str, value: Any) -> None:
    setattr(s, field, value)


def test_a_write_of_exactly_the_declared_type_is_recorded_as_a_validated_one_would_be():
    """Plain int/str/float/bool fields skip their validator for a value of exactly their type (the hot path);
    what is recorded and kept must not change, and anything else (a subclass, a constrained field) is validated."""
    def a(s):
        s.n, s.big, s.flag, s.ratio, s.text = 7, 10**30, True, 0.5, 'quote " and \u00e9'
        s.n = True  # a bool is not exactly an int: validated (lax: 1)
        s.ratio = 2  # an int into a float field: validated (2.0)

    run = Pipeline("p", Plain).then(a).build().run({})
    assert [(w.path, json.loads(w.value)) for w in run.writes] == [
        ("n", 7), ("big", 10**30), ("flag", True), ("ratio", 0.5), ("text", 'quote " and \u00e9'),
        ("n", 1), ("ratio", 2.0)]
    assert type(run.output.n) is int and type(run.output.ratio) is float
    assert json.loads(run.output_json) == {"n": 1, "big": 10**30, "flag": True, "ratio": 2.0,
                                           "text": 'quote " and \u00e9'}
    for field, value in (("positive", 0), ("short", "toolong")):
        with pytest.raises(RunFailed) as info:
            Pipeline("p", Plain).then(functools.partial(_set, field=field, value=value), id="bad").build().run({})
        assert isinstance(info.value.__cause__, ScopeWriteError) and info.value.__cause__.path == field


def test_reads_between_own_writes_are_each_recorded_once_per_source():
    def a(s):
        _ = s.n, s.n
        s.n = 1
        _ = s.n, s.n
        s.n = 2
        _ = s.n, s.text, s.n

    run = run1(a)
    assert [(r.path, r.source_step, r.source_seq) for r in run.reads] == [
        ("n", None, None), ("n", 1, 2), ("n", 1, 4), ("text", None, None)]


@pytest.mark.parametrize("stage_body, path", [
    (lambda s: setattr(s, "n", "not a number"), "n"),
    (lambda s: s.items.append("x"), "items"),
    (lambda s: s.d.__setitem__("k", "v"), "d.k"),
    (lambda s: setattr(s.profile, "name", 3), "profile.name"),
    (lambda s: s.chat.append({"role": "user"}), "chat"),
])
def test_bad_write_names_stage_field_value(stage_body, path):
    def bad(s):
        stage_body(s)

    with pytest.raises(RunFailed) as info:
        Pipeline("p", S).then(bad).build().run({})
    err = info.value.__cause__
    assert isinstance(err, ScopeWriteError)
    assert err.stage == "bad" and err.path == path
    msg = str(err)
    assert "stage 'bad'" in msg and f"'{path}'" in msg
    run = info.value.run
    assert run.status == "failed" and run.steps[-1].status == "failed"
    assert run.writes == []


def test_write_to_unknown_field():
    def a(s):
        s.nope = 1

    run = run1(a, raise_on_error=False)
    assert "no field 'nope'" in run.error


def test_delete_field_resets_to_default():
    def a(s):
        del s.items

    run = run1(a, {"items": [1, 2]})
    assert run.output.items == [] and writes(run) == [("items", "set", [])]


# -- mutation verbs ----------------------------------------------------------------


VERB_CASES = [
    ("append", lambda s: s.items.append(4), [1, 2, 3, 4], [("items", "append", 4)]),
    ("extend", lambda s: s.items.extend([4, 5]), [1, 2, 3, 4, 5],
     [("items", "append", 4), ("items", "append", 5)]),
    ("iadd", lambda s: s.items.__iadd__([4]), [1, 2, 3, 4], [("items", "append", 4)]),
    ("setitem", lambda s: s.items.__setitem__(0, 9), [9, 2, 3], [("items[0]", "set", 9)]),
    ("setitem-neg", lambda s: s.items.__setitem__(-1, 9), [1, 2, 9], [("items[2]", "set", 9)]),
    ("delitem", lambda s: s.items.__delitem__(1), [1, 3], [("items[1]", "delete", None)]),
    ("pop", lambda s: s.items.pop(), [1, 2], [("items[2]", "delete", None)]),
    ("pop0", lambda s: s.items.pop(0), [2, 3], [("items[0]", "delete", None)]),
    ("insert", lambda s: s.items.insert(0, 0), [0, 1, 2, 3], [("items", "set", [0, 1, 2, 3])]),
    ("remove", lambda s: s.items.remove(2), [1, 3], [("items[1]", "delete", None)]),
    ("clear", lambda s: s.items.clear(), [], [("items", "set", [])]),
    ("sort", lambda s: s.items.sort(reverse=True), [3, 2, 1], [("items", "set", [3, 2, 1])]),
    ("reverse", lambda s: s.items.reverse(), [3, 2, 1], [("items", "set", [3, 2, 1])]),
    ("slice-set", lambda s: s.items.__setitem__(slice(0, 2), [7]), [7, 3], [("items", "set", [7, 3])]),
    ("slice-del", lambda s: s.items.__delitem__(slice(1, None)), [1], [("items", "set", [1])]),
]


@pytest.mark.parametrize("name, op, expected, recorded", VERB_CASES, ids=[c[0] for c in VERB_CASES])
def test_list_mutation_verbs(name, op, expected, recorded):
    def st(s):
        op(s)

    run = run1(st, {"items": [1, 2, 3]})
    assert run.output.items == expected
    assert writes(run) == recorded
    assert_replays(run)


DICT_CASES = [
    ("setitem", lambda s: s.d.__setitem__("c", 3), {"a": 1, "b": 2, "c": 3}, [("d.c", "set", 3)]),
    ("del", lambda s: s.d.__delitem__("a"), {"b": 2}, [("d.a", "delete", None)]),
    ("pop", lambda s: s.d.pop("b"), {"a": 1}, [("d.b", "delete", None)]),
    ("pop-default", lambda s: s.d.pop("zz", 0), {"a": 1, "b": 2}, []),
    ("popitem", lambda s: s.d.popitem(), {"a": 1}, [("d.b", "delete", None)]),
    ("update", lambda s: s.d.update({"a": 5}, c=6), {"a": 5, "b": 2, "c": 6},
     [("d.a", "set", 5), ("d.c", "set", 6)]),
    ("ior", lambda s: s.d.__ior__({"z": 0}), {"a": 1, "b": 2, "z": 0}, [("d.z", "set", 0)]),
    ("setdefault-new", lambda s: s.d.setdefault("c", 3), {"a": 1, "b": 2, "c": 3}, [("d.c", "set", 3)]),
    ("setdefault-old", lambda s: s.d.setdefault("a", 3), {"a": 1, "b": 2}, []),
    ("clear", lambda s: s.d.clear(), {}, [("d", "set", {})]),
    ("odd-key", lambda s: s.d.__setitem__("a b", 1), {"a": 1, "b": 2, "a b": 1}, [('d["a b"]', "set", 1)]),
]


@pytest.mark.parametrize("name, op, expected, recorded", DICT_CASES, ids=[c[0] for c in DICT_CASES])
def test_dict_mutation_verbs(name, op, expected, recorded):
    def st(s):
        op(s)

    run = run1(st, {"d": {"a": 1, "b": 2}})
    assert run.output.d == expected
    assert writes(run) == recorded
    assert_replays(run)


def test_nested_dict_in_list_item_set():
    def st(s):
        s.msgs[0]["k"] = "v"
        s.msgs[1]["inner"]["deep"] = 2
        del s.msgs[0]["old"]

    run = run1(st, {"msgs": [{"old": 1}, {"inner": {}}]})
    assert run.output.msgs == [{"k": "v"}, {"inner": {"deep": 2}}]
    assert writes(run) == [("msgs[0].k", "set", "v"), ("msgs[1].inner.deep", "set", 2),
                           ("msgs[0].old", "delete", None)]
    assert_replays(run)


def test_nested_model_attribute_set():
    def st(s):
        s.profile.name = "ada"
        s.profile.tags.append("x")
        s.chat[0].content = "edited"
        s.chat.append(Msg(role="assistant", content="hi"))
        s.chat.append({"role": "user", "content": "dict is validated into Msg"})

    run = run1(st, {"chat": [{"role": "user", "content": "q"}], "profile": {"tags": ["a"]}})
    out = run.output
    assert out.profile == Profile(name="ada", tags=["a", "x"])
    assert [m.content for m in out.chat] == ["edited", "hi", "dict is validated into Msg"]
    assert isinstance(out.chat[2], Msg)
    assert writes(run)[:3] == [("profile.name", "set", "ada"), ("profile.tags", "append", "x"),
                               ("chat[0].content", "set", "edited")]
    assert writes(run)[3] == ("chat", "append", {"role": "assistant", "content": "hi"})
    assert_replays(run)


def test_unknown_nested_model_attribute():
    def st(s):
        s.profile.nope = 1

    run = run1(st, raise_on_error=False)
    assert run.status == "failed" and "profile.nope" in run.error


def test_no_unrecorded_mutation_reaches_committed_state():
    """Mutating a value read in one stage never changes what other steps saw unrecorded."""
    seen = {}

    def a(s):
        items = s.items
        seen["a"] = items
        items.append(4)

    def b(s):
        seen["b"] = list(s.items)

    inputs = {"items": [1, 2, 3]}
    run = Pipeline("p", S).then(a).then(b).build().run(inputs)
    assert inputs["items"] == [1, 2, 3]  # caller's input untouched
    assert seen["b"] == [1, 2, 3, 4]
    assert run.value_at("items", "a") == [1, 2, 3, 4]
    assert json.loads(run.input_json)["items"] == [1, 2, 3]


def test_iteration_and_views_wrap_nested_values():
    def st(s):
        for m in s.msgs:
            m["seen"] = True
        for k, v in s.d.items():
            pass
        for v in s.d.values():
            pass

    run = run1(st, {"msgs": [{}, {}], "d": {"a": 1}})
    assert run.output.msgs == [{"seen": True}, {"seen": True}]
    assert [w[0] for w in writes(run)] == ["msgs[0].seen", "msgs[1].seen"]


def test_containers_read_compare_like_plain_values():
    def st(s):
        assert s.items == [1, 2]
        assert s.d == {"a": 1}
        assert len(s.items) == 2 and 2 in s.items
        assert s.items[-1] == 2 and s.items[0:1] == [1]
        assert s.profile == Profile(name="p")
        assert s.maybe is None

    run1(st, {"items": [1, 2], "d": {"a": 1}, "profile": {"name": "p"}})


# -- buffering -----------------------------------------------------------------------


def test_stage_sees_its_own_writes():
    def st(s):
        s.n = 3
        assert s.n == 3
        s.items.append(1)
        assert s.items == [1]
        s.items = [5, 6]
        assert s.items == [5, 6]
        s.items.append(7)
        s.text = ",".join(map(str, s.items))

    run = run1(st)
    assert run.output.text == "5,6,7"


def test_failed_stage_writes_not_committed():
    def a(s):
        s.n = 1

    def b(s):
        s.n = 99
        s.items.append(1)
        assert s.n == 99  # visible to itself
        raise RuntimeError("boom")

    run = Pipeline("p", S).then(a).then(b).build().run({}, raise_on_error=False)
    assert run.status == "failed"
    assert "stage 'b' failed" in run.error and "RuntimeError: boom" in run.error
    assert run.output.n == 1 and run.output.items == []
    assert [s.status for s in run.steps] == ["ok", "failed"]
    assert writes(run) == [("n", "set", 1)]  # step b's writes never committed nor recorded
    assert {r.path for r in run.reads if r.step == 2} == {"items", "n"}  # its reads are kept
    assert run.state_at().n == 1


# -- secrets ---------------------------------------------------------------------------


def test_secrets_never_in_json():
    secret = "sk-very-secret-123"

    def st(s):
        s.text = "used " + str(len(s.api_key.get_secret_value()))
        s.api_key = SecretStr(secret + "-rotated")

    run = run1(st, {"api_key": secret})
    blobs = [run.input_json, run.output_json] + [w.value or "" for w in run.writes]
    assert not any(secret in b for b in blobs)
    assert "$redacted" in run.input_json and "$redacted" in run.output_json
    key_write = next(w for w in run.writes if w.path == "api_key")
    assert json.loads(key_write.value)["$redacted"].startswith("hmac-sha256:")
    assert run.output.api_key.get_secret_value() == secret + "-rotated"  # the live value is intact
    assert secret not in run.state_at().model_dump_json()


def test_secret_hash_is_deterministic_for_equal_values():
    a = run1(lambda s: None, {"api_key": "same"})
    b = run1(lambda s: None, {"api_key": "same"})
    c = run1(lambda s: None, {"api_key": "other"})
    assert json.loads(a.input_json)["api_key"] == json.loads(b.input_json)["api_key"]
    assert json.loads(a.input_json)["api_key"] != json.loads(c.input_json)["api_key"]


def test_secret_not_in_write_error():
    class Sec(BaseModel):
        key: SecretStr = SecretStr("")

    def st(s):
        s.key = {"leak": "hunter2"}

    run = Pipeline("p", Sec).then(st).build().run({}, raise_on_error=False)
    assert run.status == "failed" and "'key'" in run.error
    assert "hunter2" not in run.error


def test_secret_marked_with_json_schema_extra():
    from pydantic import Field

    class Sec(BaseModel):
        token: str = Field("", json_schema_extra={"secret": True})

    run = Pipeline("p", Sec).then(lambda s: setattr(s, "token", "tok-123")).build().run({"token": "tok-0"})
    assert "tok-" not in run.input_json + run.output_json + "".join(w.value for w in run.writes)


def test_augmented_assignment_records_only_the_change():
    def st(s):
        s.items += [4, 5]
        s.d |= {"z": 1}
        s.n += 2

    run = run1(st, {"items": [1], "n": 1})
    assert run.output.items == [1, 4, 5] and run.output.d == {"z": 1} and run.output.n == 3
    assert writes(run) == [("items", "append", 4), ("items", "append", 5), ("d.z", "set", 1), ("n", "set", 3)]
    assert_replays(run)


def test_stale_copy_after_reassignment_is_an_error():
    def st(s):
        old = s.items
        s.items = [7]
        old.append(5)  # would silently diverge from the recorded log

    run = run1(st, {"items": [1]}, raise_on_error=False)
    assert run.status == "failed" and "read scope.items again" in run.error
    assert run.output.items == [1]


def test_secrets_masked_in_decision_evidence_and_nested_models():
    from tracemem import decide

    class Creds(BaseModel):
        token: SecretStr = SecretStr("")

    class Sec(BaseModel):
        key: SecretStr = SecretStr("")
        creds: Creds = Creds()

    def route(s):
        return decide(s, [("has key", lambda s: len(s.key.get_secret_value()) > 3, "a"),
                          ("has token", lambda s: bool(s.creds.token.get_secret_value()), "a")], default="a")

    def rotate(s):
        s.creds.token = SecretStr("tok-SECRET-1")
        s.creds = Creds(token="tok-SECRET-2")

    run = Pipeline("p", Sec).branch(route, {"a": rotate}).build().run(
        {"key": "sk-SECRET", "creds": {"token": "tok-SECRET-0"}})
    blob = json.dumps(run.decisions[0].evidence) + run.input_json + (run.output_json or "") + "".join(
        w.value or "" for w in run.writes) + run.backtrack("creds").explain()
    assert "SECRET" not in blob
    assert run.output.creds.token.get_secret_value() == "tok-SECRET-2"


def test_containers_inside_a_tuple_cannot_change_committed_state():
    """A tuple field hands out a deep copy when it holds containers: nothing changes unrecorded."""
    class Pairs(BaseModel):
        pairs: tuple[list[int], list[int]] = ([1], [2])
        flat: tuple[int, int] = (1, 2)

    def poke(s: Pairs) -> None:
        s.pairs[0].append(99)
        assert s.flat == (1, 2)

    run = Pipeline("pairs", Pairs).then(poke).build().run({})
    assert run.output.pairs == ([1], [2]) and run.writes == []


def test_a_written_object_is_owned_by_the_scope_not_aliased():
    """Assigning an object (or one field's nested model) and mutating it afterwards changes nothing
    unrecorded: the scope keeps its own copy."""
    class Person(BaseModel):
        name: str = ""

    class Two(BaseModel):
        user: Person = Person(name="ana")
        backup: Optional[Person] = None
        tags: list[str] = []

    outside = ["x"]

    def alias(s: Two) -> None:
        u = s.user
        s.backup = u
        u.name = "bob"           # recorded as user.name; backup keeps "ana"
        s.tags = outside
        outside.append("sneaky")  # the caller's list, not the scope's

    run = Pipeline("alias", Two).then(alias).build().run({})
    assert run.output.backup.name == "ana" and run.output.user.name == "bob"
    assert run.output.tags == ["x"]
    assert run.state_at() == run.output


def test_construct_builds_what_model_construct_builds_directly_only_for_a_plain_model() -> None:
    from pydantic import ConfigDict, Field, PrivateAttr

    from tracemem.scope.schema import ScopeSchema

    class Plain(BaseModel):
        q: str = ""
        n: int = 0
        tags: list[str] = []

    class Aliased(BaseModel):
        q: str = Field("", alias="question")

    class Private(BaseModel):
        q: str = ""
        _seen: int = PrivateAttr(default=7)

    class Extra(BaseModel):
        model_config = ConfigDict(extra="allow")
        q: str = ""

    class PostInit(BaseModel):
        q: str = ""

        def model_post_init(self, context: Any) -> None:
            object.__setattr__(self, "q", self.q.upper())

    for model, data in ((Plain, {"tags": ["a"], "n": 2, "q": "x"}), (Aliased, {"q": "x"}), (Private, {"q": "x"}),
                        (Extra, {"q": "x"}), (PostInit, {"q": "x"})):
        schema = ScopeSchema(model)
        built, expected = schema.construct(dict(data)), model.model_construct(**data)
        assert built == expected and built.model_dump() == expected.model_dump(), model
        assert built.model_fields_set == expected.model_fields_set and list(vars(built)) == list(vars(expected))
        assert built.__pydantic_private__ == expected.__pydantic_private__, model
    assert ScopeSchema(Plain)._plain_construct
    assert not any(ScopeSchema(m)._plain_construct for m in (Aliased, Private, Extra, PostInit))
    assert ScopeSchema(Plain).construct({"q": "x"}).n == 0  # a field missing: model_construct fills its default


def test_the_output_reuses_each_fields_last_whole_write_exactly_as_dumping_the_final_state_would() -> None:
    class Plain(BaseModel):  # no secret field: its writes hold the values as dumped
        n: int = 0
        text: str = ""
        items: list[int] = []
        profile: Profile = Profile()
        untouched: Optional[int] = None

    def first(scope: Any) -> None:
        scope.n = 1
        scope.text = "héllo \"quoted\"\n"
        scope.profile = Profile(name="ada")

    def again(scope: Any) -> None:
        scope.n = scope.n + 41  # set twice: the last write is the final value
        scope.items = [1, 2]

    def in_place(scope: Any) -> None:
        scope.items.append(3)  # changed in place after being set whole: dumped from the final state

    for stages in ((first, again), (first, again, in_place)):
        pipeline = Pipeline("p", Plain)
        for fn in stages:
            pipeline = pipeline.then(fn)
        flow = pipeline.build()
        run = flow.run({})
        schema = flow.program.schema
        state = {name: getattr(run.output, name) for name in schema.fields}
        assert run.output_json == schema.dump_output(state, run.writes, b"", [], dumped=False)
        assert json.loads(run.output_json)["n"] == 42 and "untouched" not in json.loads(run.output_json)
