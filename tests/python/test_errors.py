"""Bad input raises ValueError / TypeError naming the argument and the value; a failed C call
raises WarpTDTError carrying tdt_status_string() and tdt_last_error(); a missing library says
where it was looked for."""

import os
import shutil
import subprocess
import sys

import pytest
import torch

import warp_tdt
from warp_tdt import _core, _lib

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def _args(device="cpu", B=2, T=5, U=3, V=6, D=3):
    return dict(token_logits=torch.randn(B, T, U + 1, V, device=device),
                duration_logits=torch.randn(B, T, U + 1, D, device=device),
                targets=torch.tensor([[1, 2, 3], [0, 4, 4]])[:B, :U],
                logit_lengths=torch.tensor([T, T - 1])[:B],
                target_lengths=torch.tensor([U, U - 1])[:B],
                blank_token_id=V - 1, durations=[0, 1, 2][:D])


def _raises(exc, match, **changes):
    kw = _args()
    kw.update(changes)
    with pytest.raises(exc, match=match):
        warp_tdt.tdt_loss(**kw)


@pytest.mark.parametrize("changes,match", [
    (dict(token_logits=torch.randn(2, 5, 4)), r"token_logits must be 4-D .* got shape \(2, 5, 4\)"),
    (dict(token_logits=torch.zeros(2, 5, 4, 6, dtype=torch.int64)), r"token_logits must be float32.*int64"),
    (dict(duration_logits=torch.randn(2, 5, 3, 3)),
     r"duration_logits has shape \(2, 5, 3, 3\) but token_logits has shape \(2, 5, 4, 6\)"),
    (dict(duration_logits=torch.randn(2, 5, 4, 4)), r"duration_logits.shape\[-1\] = 4 but len\(durations\) = 3"),
    (dict(targets=torch.tensor([[1, 2, 3]])), r"targets has shape \(1, 3\) but the batch size is 2"),
    (dict(targets=torch.tensor([[1.0, 2, 3], [0, 4, 4]])), r"targets must be an integer tensor.*float32"),
    (dict(targets=torch.tensor([1, 2])), r"targets must be 2-D, got shape \(2,\)"),
    (dict(logit_lengths=torch.tensor([5, 4, 3])), r"logit_lengths has shape \(3,\) but the batch size is 2"),
    (dict(logit_lengths=torch.tensor([5, 9])), r"logit_lengths\[1\] = 9 is outside \[0, 5\]"),
    (dict(logit_lengths=torch.tensor([-1, 4])), r"logit_lengths\[0\] = -1 is outside \[0, 5\]"),
    (dict(target_lengths=torch.tensor([4, 2])), r"target_lengths\[0\] = 4 is outside \[0, 3\]"),
    (dict(targets=torch.tensor([[1, 7, 3], [0, 4, 4]])), r"targets\[0\]\[1\] = 7 is outside \[0, 6\)"),
    (dict(targets=torch.tensor([[1, 2, 3], [0, 5, 4]])),
     r"targets\[1\]\[1\] = 5 equals blank_token_id = 5"),
    (dict(targets=torch.tensor([[1, 2, 3], [-3, 4, 4]])), r"targets\[1\]\[0\] = -3 is outside"),
    (dict(blank_token_id=6), r"blank_token_id = 6 is outside \[0, 6\)"),
    (dict(blank_token_id=-1), r"blank_token_id = -1 is outside"),
    (dict(durations=[0, -1, 2]), r"durations = \[0, -1, 2\] holds a negative duration -1"),
    (dict(durations=[0, 1, 1]), r"durations = \[0, 1, 1\] holds the duration 1 twice"),
    (dict(durations=[0, 0, 0]), r"holds the duration 0 twice"),
    (dict(durations=[0], duration_logits=torch.randn(2, 5, 4, 1)), r"no positive duration"),
    (dict(durations=[]), r"must hold 1 to 32 values"),
    (dict(durations=list(range(33)), duration_logits=torch.randn(2, 5, 4, 33)), r"1 to 32 values"),
    (dict(durations=[0, 1.5, 2]), r"must hold integers"),
    (dict(reduction="avg"), r'Invalid reduction mode "avg"'),
    (dict(sigma=-0.1), r"sigma = -0.1 is invalid"),
    (dict(sigma=float("nan")), r"sigma = nan is invalid"),
    (dict(fastemit_lambda=-1), r"fastemit_lambda = -1 is invalid"),
    (dict(omega=1.5), r"omega = 1.5 is invalid"),
    (dict(logit_lengths=torch.zeros(2, dtype=torch.int64, device="meta")),
     r"logit_lengths is on meta but the logits are on cpu"),
])
def test_bad_tdt_arguments(changes, match):
    exc = TypeError if "must be a" in match and "integer" not in match else ValueError
    _raises(exc, match, **changes)


_WANTED = r"a sequence of distinct non-negative ints, e\.g\. \[0, 1, 2, 3, 4\]"


@pytest.mark.parametrize("changes,exc,match", [
    # what a first user writes, and the error that tells them what is expected
    (dict(durations=5), TypeError, r"durations must be " + _WANTED + r", got 5 \(int\)"),
    (dict(durations=None), TypeError, r"durations must be .*, got None \(NoneType\)"),
    (dict(durations="012"), TypeError, r"durations must be .*, got '012' \(str\)"),
    (dict(durations=[0, "1", 2]), TypeError, r"got \[0, '1', 2\] holding '1' \(str\)"),
    (dict(durations=[0, None, 2]), TypeError, r"holding None \(NoneType\)"),
    (dict(durations=[0, 1.5, 2]), ValueError, r"durations = \[0, 1\.5, 2\] must hold integers: " + _WANTED),
    (dict(targets=[[1, 2, 3], [0, 4]]), TypeError,
     r"targets must be an integer tensor of shape \(batch, U\) \(or a rectangular nested list of "
     r"ints\), got list \[\[1, 2, 3\], \[0, 4\]\]"),
    (dict(targets="abc"), TypeError, r"targets must be an integer tensor of shape \(batch, U\), got 'abc'"),
    (dict(targets=None), TypeError, r"targets must be an integer tensor .*got None"),
    # a float list is refused as a float tensor is, never truncated to ints
    (dict(targets=[[1.5, 2, 3], [0, 4, 4]]), ValueError, r"targets must be an integer tensor, got dtype torch\.float"),
    (dict(logit_lengths=5), ValueError, r"logit_lengths must be 1-D, got shape \(\) \(the value 5\); expected \(batch,\)"),
    (dict(logit_lengths=torch.tensor([5.0, 4.0])), ValueError,
     r"logit_lengths must be an integer tensor, got dtype torch\.float32"),
    (dict(target_lengths=torch.tensor([True, False])), ValueError,
     r"target_lengths must be an integer tensor, got dtype torch\.bool"),
    (dict(target_lengths=torch.tensor([[3, 2]])), ValueError,
     r"target_lengths must be 1-D, got shape \(1, 2\); expected \(batch,\)"),
    (dict(blank_token_id=6), ValueError, r"blank_token_id = 6 is outside \[0, 6\) \(token_logits\.shape\[-1\] = 6"),
    (dict(blank_token_id=2.5), TypeError, r"blank_token_id must be an int, got 2\.5"),
    (dict(blank_token_id=None), TypeError, r"blank_token_id must be an int, got None"),
    (dict(reduction="meen"), ValueError, r'Invalid reduction mode "meen"\. Expected one of '
                                         r"'mean_volume', 'mean_batch', 'mean', 'sum', 'none'"),
    (dict(reduction=None), ValueError, r"Invalid reduction mode None \(NoneType\)\. Expected one of"),
    (dict(sigma=-1), ValueError, r"sigma = -1 is invalid: it must be finite and >= 0"),
    (dict(sigma="0.1"), TypeError, r"sigma must be a number, got '0\.1'"),
    (dict(sigma=None), TypeError, r"sigma must be a number, got None"),
    (dict(token_logits=None), TypeError, r"token_logits must be a torch\.Tensor, got NoneType"),
])
def test_a_new_users_mistakes_are_named(changes, exc, match):
    _raises(exc, match, **changes)


def test_plain_lists_and_numpy_arrays_are_taken():
    np = pytest.importorskip("numpy")
    kw = _args()
    want = warp_tdt.tdt_loss(**kw, reduction="none")
    for conv in (lambda t: t.tolist(), lambda t: np.asarray(t.tolist())):
        got = warp_tdt.tdt_loss(**dict(kw, targets=conv(kw["targets"]),
                                       logit_lengths=conv(kw["logit_lengths"]),
                                       target_lengths=conv(kw["target_lengths"]),
                                       durations=conv(torch.tensor(kw["durations"]))),
                                reduction="none")
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_lengths_on_another_device_are_named():
    kw = _args()
    kw["target_lengths"] = kw["target_lengths"].cuda()
    with pytest.raises(ValueError, match=r"target_lengths is on cuda:0 but the logits are on cpu"):
        warp_tdt.tdt_loss(**kw)


def _empty_target_args():
    kw = _args()
    kw["target_lengths"] = torch.tensor([3, 0])
    kw["token_logits"].requires_grad_(True)
    return kw


def test_mean_over_an_empty_target_warns_once(monkeypatch):
    """reduction="mean" divides loss_b by U_b: a sample with U_b = 0 makes the loss inf and the
    gradient non-finite (transformers' semantics, kept), and a warning says so, once, naming the
    sample and the reductions that take it."""
    from warp_tdt import functional
    monkeypatch.setattr(functional, "_warned_empty_target", False)
    kw = _empty_target_args()
    with pytest.warns(UserWarning) as record:
        loss = warp_tdt.tdt_loss(**kw)
    assert len(record) == 1, [str(r.message) for r in record]
    msg = str(record[0].message)
    assert "target_lengths[1] = 0 under reduction='mean'" in msg, msg
    for name in ("'sum'", "'mean_batch'", "'mean_volume'"):
        assert name in msg, msg
    assert record[0].filename == __file__, "the warning points at the caller's line"
    assert loss.item() == float("inf")
    loss.backward()
    assert not torch.isfinite(kw["token_logits"].grad[1]).all()
    # once a process: the next such call (and the module form) is silent
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warp_tdt.tdt_loss(**_empty_target_args())
        warp_tdt.TDTLoss()(*[_empty_target_args()[k] for k in (
            "token_logits", "duration_logits", "targets", "logit_lengths", "target_lengths",
            "blank_token_id", "durations")])


@pytest.mark.parametrize("reduction", ["sum", "mean_batch", "mean_volume", "none"])
def test_other_reductions_take_an_empty_target_silently(monkeypatch, reduction):
    import warnings
    from warp_tdt import functional
    monkeypatch.setattr(functional, "_warned_empty_target", False)
    kw = _empty_target_args()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss = warp_tdt.tdt_loss(**kw, reduction=reduction)
        loss.sum().backward()
    assert torch.isfinite(loss).all() and torch.isfinite(kw["token_logits"].grad).all()


def test_mean_warning_waits_for_the_errors(monkeypatch):
    # a call that raises gives its error, not the warning; a list of lengths is read as well
    import warnings
    from warp_tdt import functional
    monkeypatch.setattr(functional, "_warned_empty_target", False)
    kw = _empty_target_args()
    kw["targets"] = torch.tensor([[1, 7, 3], [0, 4, 4]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=r"targets\[0\]\[1\] = 7 is outside"):
            warp_tdt.tdt_loss(**kw)
    assert functional._warned_empty_target is False
    kw = _empty_target_args()
    kw["target_lengths"] = [3, 0]
    with pytest.warns(UserWarning, match=r"target_lengths\[1\] = 0"):
        warp_tdt.tdt_loss(**kw)


def test_rnnt_mean_takes_an_empty_target():
    # torchaudio's "mean" is over the batch, not per label: U_b = 0 is an ordinary sample there
    import warnings
    x = torch.randn(2, 5, 4, 6, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss = warp_tdt.rnnt_loss(x, torch.tensor([[1, 2, 3], [0, 4, 4]]), torch.tensor([5, 4]),
                                  torch.tensor([3, 0]))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("changes,match", [
    (dict(logit_lengths=torch.tensor([5, 9])), r"logit_lengths\[1\] = 9 is outside \[0, 5\]"),
    (dict(target_lengths=torch.tensor([3, -2])), r"target_lengths\[1\] = -2 is outside \[0, 3\]"),
    (dict(targets=torch.tensor([[1, 2, 3], [0, 6, 4]])), r"targets\[1\]\[1\] = 6 is outside \[0, 6\)"),
    (dict(targets=torch.tensor([[1, 2, 5], [0, 1, 4]])),
     r"targets\[0\]\[2\] = 5 equals blank_token_id = 5"),
])
def test_data_checks_without_numpy(monkeypatch, changes, match):
    # numpy is optional: the same checks and messages through torch ops on the host
    monkeypatch.setattr(_core, "_np", None)
    _raises(ValueError, match, **changes)
    kw = _args()
    kw["targets"] = torch.tensor([[1, 2, 3], [0, 4, 5]])  # the blank as padding is never read
    assert torch.isfinite(warp_tdt.tdt_loss(**kw))


def test_gpu_schedule_comes_from_the_environment(monkeypatch):
    spec = _core.Spec("joint", 5, (0, 1, 2), 4, 0.0, 0.0, 0.0, False)
    monkeypatch.delenv("WARP_TDT_GPU_SCHEDULE", raising=False)
    assert _core._options(spec, True, True)[0].gpu_schedule == _lib.GPU_SCHEDULE_AUTO
    for name, value in (("serial", 1), ("Overlap", 2), ("split", 3), ("fused", 4), ("TRAIL", 5),
                        ("auto", 0)):
        monkeypatch.setenv("WARP_TDT_GPU_SCHEDULE", name)
        assert _core._options(spec, True, True)[0].gpu_schedule == value, name
        assert _core._options(spec, False, True)[0].gpu_schedule == 0, "CPU calls ignore it"
    monkeypatch.setenv("WARP_TDT_GPU_SCHEDULE", "fastest")
    with pytest.raises(ValueError, match=r"WARP_TDT_GPU_SCHEDULE = 'fastest' is not one of"):
        _core._options(spec, True, True)


def test_environment_reads_follow_os_environ(monkeypatch):
    # _lib.EnvVar reads os.environ's own mapping: every change made through os.environ (as
    # monkeypatch makes them) shows at once, as os.environ.get would; a replaced os.environ is
    # read through its get
    var = _lib.EnvVar("WARP_TDT_TEST_ONLY_VARIABLE")
    monkeypatch.delenv("WARP_TDT_TEST_ONLY_VARIABLE", raising=False)
    assert var.get() is None and var.get("dflt") == "dflt"
    for value in ("0", "fused", "", "x" * 300, "\u00e9t\u00e9"):
        monkeypatch.setenv("WARP_TDT_TEST_ONLY_VARIABLE", value)
        assert var.get() == os.environ.get("WARP_TDT_TEST_ONLY_VARIABLE") == value, repr(value)
    monkeypatch.delenv("WARP_TDT_TEST_ONLY_VARIABLE")
    assert var.get("dflt") == "dflt"
    monkeypatch.setattr(os, "environ", {"WARP_TDT_TEST_ONLY_VARIABLE": "replaced"})
    assert var.get() == "replaced"


def test_narrow_targets_need_short_lengths():
    _raises(ValueError, r"target_lengths\[0\] = 3 exceeds targets.shape\[1\] = 2",
            targets=torch.tensor([[1, 2], [0, 4]]))


def test_bad_rnnt_arguments():
    x = torch.randn(2, 5, 4, 6)
    t, fl, ll = torch.tensor([[1, 2, 3], [0, 4, 4]]), torch.tensor([5, 4]), torch.tensor([3, 2])
    with pytest.raises(ValueError, match="reduction should be one of 'none', 'mean', or 'sum'"):
        warp_tdt.rnnt_loss(x, t, fl, ll, reduction="mean_volume")
    with pytest.raises(ValueError, match=r"blank = 6 is outside \[-6, 6\)"):
        warp_tdt.rnnt_loss(x, t, fl, ll, blank=6)
    with pytest.raises(ValueError, match=r"blank = -7 is outside"):
        warp_tdt.rnnt_loss(x, t, fl, ll, blank=-7)
    with pytest.raises(ValueError, match=r"targets\[0\]\[2\] = 3 equals blank = 3"):
        warp_tdt.rnnt_loss(x, t, fl, ll, blank=3)
    with pytest.raises(ValueError, match=r"logits must be 4-D"):
        warp_tdt.rnnt_loss(x[0], t, fl, ll)


def test_c_status_becomes_an_exception_with_the_library_detail():
    # validate=False leaves the check to the library (its CPU path reads lengths and labels)
    kw = _args()
    kw["targets"] = torch.tensor([[1, 5, 3], [0, 4, 4]])
    with pytest.raises(warp_tdt.WarpTDTError) as info:
        warp_tdt.tdt_loss(**kw, validate=False)
    e = info.value
    assert isinstance(e, ValueError) and isinstance(e, RuntimeError)
    assert e.status == 12 and e.status_name == "TDT_STATUS_INVALID_LABEL"
    assert "TDT_STATUS_INVALID_LABEL" in str(e) and e.detail and e.detail in str(e)
    assert "labels[0][1] = 5" in e.detail, e.detail
    # these logits do not require grad: the CPU call is the costs-only one
    assert e.function == "compute_tdt_loss"
    kw["token_logits"].requires_grad_(True)
    with pytest.raises(warp_tdt.WarpTDTError) as info:
        warp_tdt.tdt_loss(**kw, validate=False)
    assert info.value.function == "tdt_forward"


def test_workspace_refusal_is_a_runtime_error():
    kw = _args()
    spec = _core.Spec("separate", 6, (0, 1, 2), 5, 0.0, 0.0, 0.0, False)
    labels = kw["targets"].int().contiguous()
    fl, ll = kw["logit_lengths"].int(), kw["target_lengths"].int()
    with pytest.raises(RuntimeError, match="workspace bound"):
        _core.forward(spec, kw["token_logits"], kw["duration_logits"], labels, fl, ll,
                      workspace_bytes=64)
    # backward on a workspace that no forward filled: the CPU backend refuses it
    _, ws = _core.forward(spec, kw["token_logits"], kw["duration_logits"], labels, fl, ll)
    ws.zero_()
    with pytest.raises(warp_tdt.WarpTDTError) as info:
        _core.backward(spec, torch.ones(2), kw["token_logits"], kw["duration_logits"], labels, fl,
                       ll, ws)
    assert info.value.status_name == "TDT_STATUS_INVALID_WORKSPACE"
    assert not isinstance(info.value, ValueError)


def test_options_struct_matches_the_library():
    """The ctypes tdt_options_t: its last fields where the library reads them (each read back
    through an error that names it), then zero bytes a newer library would read as its new
    fields' defaults."""
    import ctypes
    lib = _lib.load()
    kw = _args()
    fl = kw["logit_lengths"].int()
    ll = kw["target_lengths"].int()
    labels = kw["targets"].int().contiguous()
    spec = _core.Spec("separate", 6, (0, 1, 2), 5, 0.0, 0.0, 0.0, False)
    p, o, keep = _core._build(spec, kw["token_logits"], kw["duration_logits"], labels, fl, ll,
                              False)
    n = ctypes.c_size_t(0)
    assert lib.tdt_get_workspace_size(ctypes.byref(p), ctypes.byref(o), ctypes.byref(n)) == 0
    ws = torch.empty(n.value, dtype=torch.uint8)
    costs = torch.empty(2)

    def status(opts):
        return lib.tdt_forward(ctypes.byref(p), ctypes.byref(opts), costs.data_ptr(),
                               ws.data_ptr(), n.value)

    assert status(o) == 0, _lib.last_error()
    bad = _lib.Options.from_buffer_copy(o)
    bad.reduction = 7
    assert status(bad) == 13 and "options->reduction = 7" in _lib.last_error()
    if _core.fold_pack_available():
        ind = _lib.Indices()
        ind.type = 9
        bad = _lib.Options.from_buffer_copy(o)
        bad.pack = ctypes.addressof(ind)
        assert status(bad) == 8 and "options->pack->type = 9" in _lib.last_error(), \
            _lib.last_error()
    if _core._has_version(600):  # the last field: tdt_forward() has no gradient rows for it
        bad = _lib.Options.from_buffer_copy(o)
        bad.state_in_grads = 1
        assert status(bad) == 13 and "options->state_in_grads = 1" in _lib.last_error(), \
            _lib.last_error()
    tail = _lib.Options._newer_fields_zero
    raw = bytes(o)
    assert tail.offset + tail.size == ctypes.sizeof(_lib.Options) and tail.size >= 256
    assert raw[tail.offset:] == bytes(tail.size)
    del keep


def test_mixed_devices_raise():
    if not warp_tdt.cuda_available():
        pytest.skip("needs CUDA")
    kw = _args()
    with pytest.raises(ValueError, match="token_logits is on cpu but duration_logits is on cuda"):
        warp_tdt.tdt_loss(**dict(kw, duration_logits=kw["duration_logits"].cuda()))
    with pytest.raises(ValueError, match="targets is on cuda:0 but the logits are on cpu"):
        warp_tdt.tdt_loss(**dict(kw, targets=kw["targets"].cuda()))


def _run_python(code, env_changes, cwd):
    env = dict(os.environ)
    env.pop("WARP_TDT_LIBRARY", None)
    env.update(env_changes)
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_library_not_found_names_where_it_looked(tmp_path):
    # a copy of the package outside the repository: nothing next to it, no build tree
    pkg = tmp_path / "site" / "warp_tdt"
    shutil.copytree(os.path.join(REPO, "pytorch_binding", "warp_tdt"), pkg,
                    ignore=shutil.ignore_patterns("*.so*", "__pycache__"))
    code = ("import warp_tdt, torch\n"
            "try:\n"
            "    warp_tdt.tdt_loss(torch.zeros(1,2,1,3), torch.zeros(1,2,1,2), torch.zeros(1,0,dtype=torch.long),"
            " [2], [0], 2, [0,1])\n"
            "except warp_tdt.LibraryNotFoundError as e:\n"
            "    print('MESSAGE', e)\n")
    r = _run_python(code, {"PYTHONPATH": str(tmp_path / "site")}, str(tmp_path))
    assert "MESSAGE" in r.stdout, r.stdout + r.stderr
    assert str(pkg / "libwarptdt.so") in r.stdout
    assert os.path.join(str(tmp_path), "build", "libwarptdt.so") in r.stdout
    # an installed package (no repository around it): reinstall with pip, or WARP_TDT_LIBRARY
    assert "WARP_TDT_LIBRARY=" in r.stdout and "pip install --no-build-isolation" in r.stdout, \
        r.stdout
    r = _run_python("import warp_tdt\ntry:\n    warp_tdt.library_path()\nexcept OSError as e:\n"
                    "    print('MESSAGE', e)\n",
                    {"PYTHONPATH": str(tmp_path / "site"), "WARP_TDT_LIBRARY": "/nonexistent/libx.so"},
                    str(tmp_path))
    assert "MESSAGE warp_tdt: WARP_TDT_LIBRARY=/nonexistent/libx.so does not name a file" in r.stdout, \
        r.stdout + r.stderr


def test_version_and_backend_queries():
    assert warp_tdt.library_version().count(".") == 2
    assert _lib.version() == 100 * int(warp_tdt.library_version().split(".")[1]) + \
        10000 * int(warp_tdt.library_version().split(".")[0]) + int(warp_tdt.library_version().split(".")[2])
    assert os.path.isfile(warp_tdt.library_path())
    assert isinstance(warp_tdt.cuda_available(), bool)
    assert _lib.backend_built(_lib.LOCATION_CPU)


@pytest.mark.parametrize("numpy", [True, False])
def test_data_checks_name_the_first_bad_element_on_random_data(monkeypatch, numpy):
    # The fast checks (tdt_check_data, or a few reductions) decide only whether all is well;
    # the message must still name the first bad element in the documented order: frame
    # lengths, then label lengths, then labels out of range, then labels equal to the blank
    # (row-major).
    if not numpy:
        monkeypatch.setattr(_core, "_np", None)
    g = torch.Generator().manual_seed(5)
    B, T, U, V, D = 3, 5, 3, 6, 3
    tok, dur = torch.randn(B, T, U + 1, V), torch.randn(B, T, U + 1, D)
    for _ in range(150):
        fl = torch.randint(-1, T + 2, (B,), generator=g) if torch.rand((), generator=g) < 0.3 \
            else torch.randint(0, T + 1, (B,), generator=g)
        ll = torch.randint(-1, U + 2, (B,), generator=g) if torch.rand((), generator=g) < 0.3 \
            else torch.randint(0, U + 1, (B,), generator=g)
        targets = torch.randint(0, V - 1, (B, U), generator=g)
        for _ in range(int(torch.randint(0, 3, (), generator=g))):
            b, i = int(torch.randint(0, B, (), generator=g)), int(torch.randint(0, U, (), generator=g))
            targets[b, i] = int(torch.randint(-2, V + 2, (), generator=g))
        expected = None
        for b in range(B):
            if expected is None and not 0 <= int(fl[b]) <= T:
                expected = r"logit_lengths\[%d\] = %d is outside" % (b, int(fl[b]))
        for b in range(B):
            if expected is None and not 0 <= int(ll[b]) <= U:
                expected = r"target_lengths\[%d\] = %d is outside" % (b, int(ll[b]))
        for kind in ("range", "blank"):
            for b in range(B):
                for i in range(int(ll[b]) if 0 <= int(ll[b]) <= U else 0):
                    y = int(targets[b, i])
                    bad = not 0 <= y < V if kind == "range" else y == V - 1
                    if expected is None and bad:
                        expected = r"targets\[%d\]\[%d\] = %d %s" % (
                            b, i, y, "is outside" if kind == "range" else "equals blank_token_id")
        kw = dict(token_logits=tok, duration_logits=dur, targets=targets, logit_lengths=fl,
                  target_lengths=ll, blank_token_id=V - 1, durations=[0, 1, 2])
        # the library's own check (tdt_check_data, the fast path) agrees that all is well
        packed = torch.cat([fl, ll, targets.reshape(-1)]).to(torch.int32)
        spec = _core.Spec("separate", V, (0, 1, 2), V - 1, 0.0, 0.0, 0.0, False)
        base = packed.data_ptr()
        assert _core._library_says_ok(spec, T, U, B, (base, base + 4 * B, base + 8 * B)) \
            == (expected is None), (fl, ll, targets)
        if expected is None:
            warp_tdt.tdt_loss(**kw, reduction="none")
        else:
            with pytest.raises(ValueError, match=expected):
                warp_tdt.tdt_loss(**kw)
