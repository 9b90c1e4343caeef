# space's Python kernel for the E2B code interpreter (internal/e2b): one
# process per code context, state kept in one namespace across executions.
# Reads one JSON request per line on stdin ({"id", "code", "env"}); writes
# each message as "\x1e" + JSON + "\n" on stdout, the request's id in its
# number_of_executions (the host tells this execution's output from an
# earlier one's by it). Anything else on fd 1 (a subprocess, os.write) is
# plain output the host passes on as stdout. The requests are read from a
# private copy of fd 0; fd 0 itself is /dev/null, so a subprocess of a cell
# (which inherits it) cannot read the requests meant for this driver.
# Started by a warm pool before its sandbox had an owner, it gets
# "--preload m1,m2": it imports those, says {"type": "ready"}, and its
# first line is {"init": {"env": {...}}} from the agent at the claim, the
# owner's environment, which it makes its own.
import ast, base64, io, json, os, signal, sys, threading, traceback

os.environ.setdefault("MPLBACKEND", "Agg")
_out = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8", errors="replace")
_lock = threading.Lock()


def _emit(msg):
    if msg["type"] not in ("stdout", "stderr"):
        for s in (sys.stdout, sys.stderr):
            if isinstance(s, _Stream):
                s.flush()
    with _lock:
        _out.write("\x1e" + json.dumps(msg) + "\n")
        _out.flush()


class _Stream(io.TextIOBase):
    """Collects writes into whole lines (print writes text and newline
    separately); flush sends the rest."""

    def __init__(self, kind):
        self.kind = kind
        self.buf = ""

    def write(self, s):
        self.buf += s
        i = self.buf.rfind("\n")
        if i >= 0:
            text, self.buf = self.buf[:i + 1], self.buf[i + 1:]
            _emit({"type": self.kind, "text": text})
        return len(s)

    def flush(self):
        if self.buf:
            text, self.buf = self.buf, ""
            _emit({"type": self.kind, "text": text})

    def writable(self):
        return True

    def isatty(self):
        return False


_FORMATS = [("_repr_html_", "html"), ("_repr_markdown_", "markdown"), ("_repr_svg_", "svg"),
            ("_repr_png_", "png"), ("_repr_jpeg_", "jpeg"), ("_repr_latex_", "latex"),
            ("_repr_json_", "json"), ("_repr_javascript_", "javascript")]


def _formats(value):
    out = {"text": repr(value)}
    for meth, key in _FORMATS:
        f = getattr(value, meth, None)
        if f is None:
            continue
        try:
            r = f()
        except Exception:
            continue
        if r is None:
            continue
        if isinstance(r, tuple):
            r = r[0]
        if isinstance(r, bytes):
            r = base64.b64encode(r).decode()
        out[key] = r
    fig = sys.modules.get("matplotlib.figure")
    if fig is not None and isinstance(value, fig.Figure):
        out["png"] = _png(value)
    return out


def _png(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def _figures():
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    for num in plt.get_fignums():
        fig = plt.figure(num)
        _emit({"type": "result", "text": repr(fig), "png": _png(fig), "extra": {}, "is_main_result": False})
    plt.close("all")


def display(*objs, **_):
    for o in objs:
        _emit(dict(_formats(o), type="result", extra={}, is_main_result=False))


_ns = {"__name__": "__main__", "display": display}


def _run(code):
    tree = ast.parse(code, "<cell>", "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, "<cell>", "exec"), _ns)
    value = eval(compile(last, "<cell>", "eval"), _ns) if last is not None else None
    _figures()
    if value is not None:
        _ns["_"] = value
        _emit(dict(_formats(value), type="result", extra={}, is_main_result=True))


# SIGINT interrupts the running cell (the host sends it when the client
# stopped waiting); between cells it is ignored, so it cannot kill the kernel.
_running = False


def _sigint(signum, frame):
    if _running:
        raise KeyboardInterrupt


def _preload(names):
    """Imports names (best effort, quietly: a missing module or a warning
    is the owner's to see when their code imports it)."""
    import contextlib, importlib, warnings
    with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in names:
            try:
                importlib.import_module(name)
            except Exception:
                pass


def _init(env):
    """Takes the owner's environment (see the top)."""
    os.environ.update(env)
    backend = env.get("MPLBACKEND")
    plt = sys.modules.get("matplotlib.pyplot")
    if backend and plt is not None:
        try:
            plt.switch_backend(backend)
        except Exception:
            pass


def _requests():
    """Takes fd 0 (the host's requests) for this driver alone and leaves
    /dev/null in its place for the cells and their subprocesses."""
    fd = os.dup(0)  # not inheritable (PEP 446): no subprocess gets it
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = open(0, "r", closefd=False)
    return os.fdopen(fd, "r", encoding="utf-8", errors="replace")


def _setenv(env, saved):
    """Sets a request's env for its execution, noting in saved what each
    key was before (None: unset) for _restore."""
    for k, v in env.items():
        saved.setdefault(k, os.environ.get(k))
        os.environ[k] = v


def _restore(saved):
    """Puts back the keys a request's env set; everything else the cell did
    to os.environ stays, as in a Jupyter kernel."""
    for k, v in saved.items():
        try:
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        except Exception:
            pass


def main():
    global _running
    signal.signal(signal.SIGINT, _sigint)
    requests = _requests()
    prestarted = len(sys.argv) > 2 and sys.argv[1] == "--preload"
    if prestarted:
        _preload([n for n in sys.argv[2].split(",") if n])
    sys.stdout, sys.stderr = _Stream("stdout"), _Stream("stderr")
    if prestarted:
        _emit({"type": "ready"})
    count = 0
    for line in requests:
        try:
            req = json.loads(line)
        except ValueError:
            continue
        if not isinstance(req, dict):
            continue
        if "init" in req:
            _init((req["init"] or {}).get("env") or {})
            continue
        count += 1
        start = {"type": "number_of_executions", "execution_count": count}
        if isinstance(req.get("id"), str):
            start["id"] = req["id"]
        _emit(start)
        saved = {}
        try:
            # In the try: a key the environment cannot hold (with "=" or
            # NUL) fails this execution, not the kernel.
            _setenv(req.get("env") or {}, saved)
            _running = True
            _run(req.get("code", ""))
            _running = False
        except BaseException as e:  # SystemExit and KeyboardInterrupt too: the kernel lives on
            _running = False
            tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
            _emit({"type": "error", "name": type(e).__name__, "value": str(e), "traceback": tb})
        finally:
            _running = False
            _restore(saved)
            _emit({"type": "end_of_execution"})


main()
