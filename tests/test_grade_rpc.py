"""The plain-data calls between the grader's judge and a sandbox (kernels.grade.rpc).

What crosses must come back as it went (values, dtypes, layouts, in-place writes, exceptions by name),
and nothing the sandbox sends may make the judge run code: no pickle, no names outside the package, no
sizes that do not add up.
"""

import fractions
import math
import os
import threading

import numpy as np
import pytest
import torch

from kernels import formats
from kernels._bounds import OutOfBounds
from kernels.checks import call_student
from kernels.grade import rpc as grade_rpc


def _round_trip(value, refs=None):
    encode = grade_rpc.Encoder(refs)
    tree = encode(value)
    return grade_rpc.Decoder(encode.blobs, refs=refs)(tree)


def test_plain_values_come_back_equal_and_of_their_type():
    values = [
        None,
        True,
        7,
        2**80,
        -0.0,
        math.inf,
        "Zoë",
        b"\x00\xff",
        fractions.Fraction(3, 7),
        1 + 2j,
        slice(1, None, 2),
        Ellipsis,
        (1, [2, {"a": 3}]),
        {1, 2},
        frozenset({3}),
        torch.float8_e4m3fn,
        torch.Size([2, 3]),
        np.float32(1.5),
        formats.E4M3FN,
    ]
    for v in values:
        got = _round_trip(v)
        assert type(got) is type(v) and got == v, v
    assert math.isnan(_round_trip(math.nan))
    assert _round_trip(formats.E8M0) is formats.E8M0  # the package's own constant, so `is` works


def test_tensors_and_arrays_keep_dtype_shape_layout_and_bits():
    x = torch.randn(4, 6).t()  # not contiguous
    cases = [
        x,
        torch.randn(3).to(torch.bfloat16),
        torch.randn(5).to(torch.float8_e5m2),
        torch.tensor(3.0),
        torch.zeros(0, 4),
        torch.tensor([True, False]),
        torch.arange(10, dtype=torch.int64) - 5,
    ]
    for t in cases:
        got = _round_trip(t)
        assert got.dtype == t.dtype and got.shape == t.shape
        assert torch.equal(got.reshape(-1).view(torch.uint8), t.contiguous().reshape(-1).view(torch.uint8))
    assert _round_trip(x).stride() == x.stride()
    a = np.arange(12, dtype=np.uint16).reshape(3, 4)
    assert np.array_equal(_round_trip(a), a) and _round_trip(a).dtype == np.uint16
    assert _round_trip(torch.ones(2, requires_grad=True)).requires_grad


def test_objects_that_are_not_data_stay_behind_as_references():
    refs = grade_rpc.Refs()
    fn = lambda x: x  # noqa: E731
    tree = grade_rpc.Encoder(refs)(fn)
    assert tree["t"] == "ref" and tree["kind"] == "callable" and refs.get(tree["id"]) is fn
    with pytest.raises(TypeError, match="only plain data crosses"):
        grade_rpc.Encoder()(fn)  # the judge never sends its own objects


@pytest.mark.parametrize(
    "tree, blobs, match",
    [
        ({"t": "tensor", "dtype": "float32", "shape": [4], "b": 0}, [b"\0" * 15], "size does not match"),
        ({"t": "tensor", "dtype": "__import__", "shape": [1], "b": 0}, [b"\0"], "not a torch dtype"),
        ({"t": "ndarray", "dtype": "O", "shape": [1], "b": 0}, [b"\0" * 8], "not plain data"),
        ({"t": "dataclass", "module": "os", "qualname": "system", "v": {}}, [], "not a name in the package"),
        ({"t": "dataclass", "module": "kernels.grade", "qualname": "main", "v": {}}, [], "not a package dataclass"),
        ({"t": "pickle", "v": "..."}, [], "unknown value type"),
        ({"t": "tensor", "dtype": "float32", "shape": [1], "b": 5}, [], "bad buffer index"),
        ({"t": "ref", "id": 99}, [], "no object number"),
    ],
)
def test_a_malformed_or_hostile_value_is_refused(tree, blobs, match):
    with pytest.raises(grade_rpc.ProtocolError, match=match):
        grade_rpc.Decoder(blobs, refs=grade_rpc.Refs())(tree)


def test_a_message_larger_than_the_limit_is_refused():
    r, w = os.pipe()
    grade_rpc.write_message(w, {"op": "x"}, [b"\0" * 4096])
    os.close(w)
    with pytest.raises(grade_rpc.ProtocolError, match="the limit is 1000"):
        grade_rpc.read_message(r, limit=1000)
    os.close(r)


def _served(namespace, names):
    """A client talking to :func:`grade_rpc.serve` on a thread (the sandbox's side, in-process)."""
    requests_r, requests_w = os.pipe()
    answers_r, answers_w = os.pipe()
    thread = threading.Thread(target=grade_rpc.serve, args=(requests_r, answers_w, namespace, names), daemon=True)
    thread.start()
    client = grade_rpc.Client(answers_r, requests_w)
    return client, client.hello(), (thread, requests_w)


def test_calls_methods_and_in_place_writes_go_through_the_proxy():
    class Counter:
        def __init__(self, start):
            self.n = start

        def add(self, k):
            self.n += k
            return self.n

    def unscale_(grads, found, inv):
        for g in grads:
            g.mul_(inv)
        found.fill_(1.0)

    def broken(x):
        raise NotImplementedError("not yet")

    namespace = {"Counter": Counter, "unscale_": unscale_, "broken": broken, "answer": 42}
    client, names, (thread, requests_w) = _served(namespace, [*namespace, "missing"])
    assert names["answer"] == 42 and "missing" not in names
    counter = names["Counter"](start=5)
    assert counter.add(2) == 7 and counter.n == 7
    assert grade_rpc.remote_kind(names["Counter"]) == "class" and names["Counter"].__name__ == "Counter"
    assert grade_rpc.remote_kind(counter) == "object" and not callable(counter)
    grads, found = [torch.ones(3), torch.full((2,), 4.0)], torch.zeros(())
    names["unscale_"](grads, found, torch.tensor(0.5))
    assert grads[0].tolist() == [0.5] * 3 and grads[1].tolist() == [2.0, 2.0] and float(found) == 1.0
    with pytest.raises(NotImplementedError, match="not yet"):
        names["broken"](1)
    os.close(requests_w)
    thread.join(timeout=10)
    assert not thread.is_alive()  # the sandbox stops serving when the judge closes its end


def test_a_sandbox_that_dies_mid_question_is_named_not_believed():
    requests_r, requests_w = os.pipe()
    answers_r, answers_w = os.pipe()
    grade_rpc.write_message(answers_w, {"op": "ready", "names": {"f": {"t": "ref", "id": 1, "kind": "callable"}}})
    os.close(answers_w)  # then gone, as after os._exit
    client = grade_rpc.Client(answers_r, requests_w)
    f = client.hello()["f"]
    with pytest.raises(grade_rpc.SandboxGone):
        f(1)
    assert client.gone
    with pytest.raises(grade_rpc.SandboxGone):
        f(2)  # and every later call too, without waiting
    for fd in (requests_r, requests_w, answers_r):
        os.close(fd)


def test_an_out_of_bounds_error_crosses_as_the_bounds_checks_own_class():
    """The judge's checks match the bounds check's refusal by its class, whatever wraps it."""

    def oob_kernel():
        try:
            raise OutOfBounds("out-of-bounds tl.load: 24 of 1024 active lanes address memory outside")
        except OutOfBounds as e:
            raise RuntimeError("the interpreter's wrapper") from e

    client, names, (thread, requests_w) = _served({"oob_kernel": oob_kernel}, ["oob_kernel"])
    with pytest.raises(RuntimeError) as raised:
        names["oob_kernel"]()
    cause = raised.value.__cause__
    assert isinstance(cause, OutOfBounds) and isinstance(cause, grade_rpc.RemoteError)
    assert str(cause).startswith("out-of-bounds tl.load: 24 of 1024")
    with pytest.raises(AssertionError, match=r"^q1: copy: out-of-bounds tl\.load: 24 of 1024 active lanes"):
        call_student(names["oob_kernel"], name="copy", question="q1")
    os.close(requests_w)
    thread.join(timeout=10)
