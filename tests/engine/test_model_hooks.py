"""Levers swap a layer's behaviour on the scheduler's own model instance only
(:mod:`workbench.engine.model_hooks`): nothing rebinds an MLX or mlx-lm class attribute or
module function, so two schedulers on two models in two threads each compute the bits they
compute alone."""

from __future__ import annotations

import ast
import threading
from pathlib import Path

import mlx.nn as nn
import mlx_lm.models.base as mlx_base
import mlx_lm.models.llama as llama
import pytest

import workbench as wb
from workbench.engine.model_hooks import hooked_class_of

ENGINE = Path(wb.__file__).parent / "engine"
PATCHED_NAMES = {
    "__call__",
    "as_linear",
    "scaled_dot_product_attention",
    "quantized_scaled_dot_product_attention",
}
CLASS_METHODS = {
    c: dict(vars(c)) for c in (nn.Linear, nn.QuantizedLinear, nn.Embedding, nn.QuantizedEmbedding)
}


def _mlx_names(tree: ast.AST) -> set[str]:
    """Names a module binds by importing ``mlx`` or ``mlx_lm`` (modules and their classes)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {
                (a.asname or a.name).split(".")[0]
                for a in node.names
                if a.name.split(".")[0] in ("mlx", "mlx_lm")
            }
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("mlx", "mlx_lm"):
            names |= {a.asname or a.name for a in node.names}
    return names


def _root(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _loop_targets(tree: ast.AST) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.comprehension)):
            out |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
    return out


def patches(source: str) -> list[str]:
    """The statements of ``source`` that rebind an attribute of an MLX or mlx-lm class or
    module: an assignment (or ``del``) to an attribute rooted at a name imported from them, to
    an attribute named as a layer's call or mlx-lm's attention function, or a ``setattr`` /
    ``delattr`` on such a name or on a loop variable (the loop-over-classes pattern)."""
    tree = ast.parse(source)
    mlx, loops, found = _mlx_names(tree), _loop_targets(tree), []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        while targets:
            t = targets.pop()
            if isinstance(t, (ast.Tuple, ast.List)):
                targets += t.elts
            elif isinstance(t, ast.Attribute) and (_root(t) in mlx or t.attr in PATCHED_NAMES):
                found.append(f"line {node.lineno}: {ast.unparse(t)}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("setattr", "delattr")
        ):
            first = node.args[0] if node.args else None
            if first is not None and (
                _root(first) in mlx or (isinstance(first, ast.Name) and first.id in loops)
            ):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_the_patch_finder_finds_each_pattern_the_engine_once_used():
    assert patches("import mlx.nn as nn\nnn.Linear.__call__ = f\n")
    assert patches("import mlx_lm.models.base as b\nb.quantized_scaled_dot_product_attention = f\n")
    assert patches("for cls, name in pairs:\n    setattr(cls, name, f)\n")
    assert patches("for m in mods:\n    m.scaled_dot_product_attention = f\n")
    assert not patches("state.tokens = []\nsetattr(state, name, 1)\nobject.__setattr__(attn, 'rope', r)\n")


@pytest.mark.parametrize("path", sorted(ENGINE.rglob("*.py")), ids=lambda p: str(p.relative_to(ENGINE)))
def test_no_engine_module_rebinds_an_mlx_or_mlx_lm_attribute(path):
    found = patches(path.read_text())
    assert not found, f"{path.relative_to(ENGINE)} rebinds MLX / mlx-lm attributes: {found}"


def _model():
    return wb.load()  # a fresh instance of the bundled model each call


def _requests(prompt, hook=None):
    procs = [] if hook is None else [hook]
    return [
        wb.Request(prompt=prompt(n, 11 * n), max_tokens=8, logits_processors=list(procs)) for n in (5, 9, 14)
    ]


def _bits(sched, uids):
    return [(sched.tokens(u), sched.logprobs(u)) for u in uids]


def _alone(model, tok, reqs, **settings):
    sched = wb.Scheduler(model, tok, max_batch=3, **settings)
    uids = [sched.submit(r) for r in reqs]
    sched.run()
    return _bits(sched, uids)


def test_classes_and_module_functions_stay_mlx_lms_during_an_invariant_forward(bundled, prompt):
    """Inside the decode forward of a batch-invariant scheduler (a logits processor runs
    there), MLX's projection classes and mlx-lm's attention functions are their own."""
    seen = []
    sdpa, qsdpa = llama.scaled_dot_product_attention, mlx_base.quantized_scaled_dot_product_attention

    def look(tokens, logits):
        seen.append(
            all(dict(vars(c)) == m for c, m in CLASS_METHODS.items())
            and llama.scaled_dot_product_attention is sdpa
            and mlx_base.quantized_scaled_dot_product_attention is qsdpa
        )
        return logits

    model, tok = _model()
    sched = wb.Scheduler(model, tok, max_batch=3, batch_invariant=True)
    for r in _requests(prompt, look):
        sched.submit(r)
    sched.run()
    assert seen and all(seen)
    proj = model.layers[0].self_attn.q_proj
    assert type(proj) is not nn.Linear and hooked_class_of(proj) is nn.Linear  # hooked per instance


@pytest.mark.parametrize(
    "first", [{"batch_invariant": True}, {}], ids=["invariant+default", "default+default"]
)
def test_two_schedulers_on_two_models_in_two_threads_give_the_bits_of_each_alone(prompt, first):
    """Scheduler A (``first``'s settings) pauses inside each of its forwards (a logits
    processor, under every hook A set) while scheduler B, on another model in another thread,
    runs a whole engine iteration; both then equal their runs alone, tokens and log-probs."""
    (model_a, tok), (model_b, _) = _model(), _model()
    want_a = _alone(model_a, tok, _requests(prompt, lambda t, x: x), **first)
    want_b = _alone(model_b, tok, _requests(prompt, lambda t, x: x)[::-1][:2])
    go, done, stop = threading.Event(), threading.Event(), threading.Event()
    b = wb.Scheduler(model_b, tok, max_batch=3)
    b_uids = [b.submit(r) for r in _requests(prompt, lambda t, x: x)[::-1][:2]]
    errors = []

    def run_b():
        try:
            while not stop.is_set():
                if go.wait(0.05):
                    go.clear()
                    if not b.idle:
                        b._iterate()
                    done.set()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            done.set()

    def pause(tokens, logits):  # A is inside its forward: B steps meanwhile
        go.set()
        assert done.wait(60), "B did not step"
        done.clear()
        return logits

    thread = threading.Thread(target=run_b)
    thread.start()
    try:
        a = wb.Scheduler(model_a, tok, max_batch=3, **first)
        a_uids = [a.submit(r) for r in _requests(prompt, pause)]
        a.run()
    finally:
        stop.set()
        thread.join()
    assert not errors, errors
    b.run()  # what B has left after A finished
    assert _bits(a, a_uids) == want_a
    assert _bits(b, b_uids) == want_b


def test_hooks_reach_this_models_layers_only_and_compute_mlxs_call_with_no_hook_set():
    """Hooked per instance: another instance of the same class keeps MLX's class; a
    subclass overriding its call is left alone; with no hook set a hooked projection gives
    MLX's bits, and with one set only this model's projection runs it."""
    import mlx.core as mx

    from workbench.engine.model_hooks import hooks_of

    class Own(nn.Linear):
        def __call__(self, x):
            return x

    model, other = nn.Sequential(nn.Linear(4, 3), Own(4, 4)), nn.Sequential(nn.Linear(4, 3))
    other.layers[0].update(model.layers[0].parameters())
    x = mx.random.normal((2, 4), key=mx.random.key(1))
    want = other.layers[0](x)
    hooks = hooks_of(model, projections=True)
    lin, own = model.layers
    assert type(lin) is not nn.Linear and hooked_class_of(lin) is nn.Linear and type(own) is Own
    assert type(other.layers[0]) is nn.Linear
    assert mx.array_equal(lin(x), want).item()
    with hooks.using(projections=lambda module, plain, x: plain(module, x) * 0):
        assert not lin(x).any().item() and mx.array_equal(other.layers[0](x), want).item()
    assert mx.array_equal(lin(x), want).item()


def _tiny_llama():
    args = llama.ModelArgs.from_dict(
        dict(
            model_type="llama",
            hidden_size=32,
            num_hidden_layers=2,
            intermediate_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            rms_norm_eps=1e-5,
            vocab_size=50,
        )
    )
    return llama.Model(args)


def test_calling_hands_each_layers_attention_to_the_given_function_without_a_frame_of_model_hooks():
    """``ModelHooks.calling(f)``: inside the block each hooked layer calls ``f(original, ...)``
    itself (no frame of ``model_hooks`` in between; ``original`` computes mlx-lm's attention),
    another model is untouched, and the layers call ``sdpa`` again after, also after an exception."""
    import sys

    import mlx.core as mx

    from workbench.engine import model_hooks
    from workbench.engine.model_hooks import hooks_of

    model, other = _tiny_llama(), _tiny_llama()
    x = mx.array([[1, 2, 3]])
    plain = model(x)
    seen, entered = [], []

    def attention(original, queries, keys, values, cache, scale, mask, sinks=None):
        seen.append(queries.shape)
        return original(queries, keys, values, cache, scale, mask, sinks)

    def own(original, queries, keys, values, cache, scale, mask, sinks=None):
        return queries

    def tracer(frame, event, arg):
        if event == "call" and frame.f_code.co_filename == model_hooks.__file__:
            entered.append(frame.f_code.co_name)

    hooks = hooks_of(model)
    hooks_of(other)
    with hooks.calling(attention):
        other(x)
        assert not seen, "another model's layers keep their own attention"
        assert mx.array_equal(model(x), plain) and len(seen) == 2
    with hooks.calling(own):
        sys.setprofile(tracer)
        try:
            model(x)
        finally:
            sys.setprofile(None)
    assert entered == []
    with pytest.raises(RuntimeError), hooks.calling(attention):
        raise RuntimeError("interrupted")
    seen.clear()
    model(x)
    assert not seen, "restored after the block"


def test_a_hooked_attention_reaches_a_paged_caches_attend_through_one_python_call_and_makes_no_function():
    """The packed layout's hot path: each hooked layer's call of its file's attention enters
    one Python function of ``model_hooks`` (``ModelHooks.sdpa``: no wrapper frame, no
    closure made per call) before the paged cache's ``attend``."""
    import sys

    import mlx.core as mx

    from workbench.engine import model_hooks
    from workbench.engine.model_hooks import hooks_of

    model = _tiny_llama()
    hooks_of(model)

    class Paged:  # a paged layer: RoPE offset, writes nothing, attends by itself
        offset = 0

        def update_and_fetch(self, k, v):
            return k, v

        def make_mask(self, *a, **k):
            return None

        def attend(self, queries, scale):
            return queries

    entered = []

    def tracer(frame, event, arg):
        if event == "call" and frame.f_code.co_filename == model_hooks.__file__:
            entered.append(frame.f_code.co_name)

    sys.setprofile(tracer)
    try:
        model(mx.array([[1, 2, 3]]), cache=[Paged(), Paged()])
    finally:
        sys.setprofile(None)
    assert entered == ["sdpa", "sdpa"]
