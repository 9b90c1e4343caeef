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
import ast, base64, io, json, os, re, signal, sys, threading, traceback

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


def _text(r):
    """A text/plain result as E2B's server gives it: the quotes around a
    str's repr stripped ('bar' is bar)."""
    if isinstance(r, str) and len(r) >= 2 and r[0] == r[-1] == "'":
        return r[1:-1]
    return r


def _formats(value):
    out = {"text": _text(repr(value))}
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
        chart = _chart(value)
        if chart is not None:
            out["chart"] = chart
    data = _data(value)
    if data is not None:
        out["data"] = data
    return out


def _png(fig):
    return base64.b64encode(_png_bytes(fig)).decode()


def _unit(label):
    """The unit in an axis label's brackets ("Time (s)" → "s"), as E2B's
    extractor reads it."""
    m = re.search(r"\((.+?)\)|\[(.+?)\]", label or "")
    return (m.group(1) or m.group(2)) if m else None


def _axis(ax, which):
    get = getattr(ax, "get_" + which + "ticks")
    labels = getattr(ax, "get_" + which + "ticklabels")
    return {which + "_ticks": [_jsonable(v) for v in get()],
            which + "_tick_labels": [t.get_text() for t in labels()],
            which + "_scale": getattr(ax, "get_" + which + "scale")()}


def _ax_chart(ax):
    """E2B's chart of one matplotlib Axes: line, scatter, bar or pie (else
    unknown), with its title, axis labels and elements."""
    from matplotlib.collections import PathCollection
    from matplotlib.container import BarContainer
    from matplotlib.patches import Wedge
    title = ax.get_title()
    two_d = {"x_label": ax.get_xlabel() or None, "y_label": ax.get_ylabel() or None,
             "x_unit": _unit(ax.get_xlabel()), "y_unit": _unit(ax.get_ylabel())}
    wedges = [p for p in ax.patches if isinstance(p, Wedge)]
    if wedges:
        return {"type": "pie", "title": title, "elements": [
            {"label": w.get_label(), "angle": abs(w.theta2 - w.theta1), "radius": w.r} for w in wedges]}
    bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    if bars:
        ticks = list(ax.get_xticks())
        names = [t.get_text() for t in ax.get_xticklabels()]
        elements = []
        for c in bars:
            for r in c.patches:
                x = r.get_x() + r.get_width() / 2
                label = str(_jsonable(x))
                if ticks and len(names) == len(ticks):
                    i = min(range(len(ticks)), key=lambda j: abs(ticks[j] - x))
                    label = names[i] or label
                elements.append({"label": label, "group": c.get_label(), "value": _jsonable(r.get_height())})
        return dict(two_d, type="bar", title=title, elements=elements)
    scatters = [c for c in ax.collections if isinstance(c, PathCollection)]
    if scatters:
        elements = [{"label": c.get_label(), "points": [[_jsonable(x), _jsonable(y)] for x, y in c.get_offsets()]} for c in scatters]
        return dict(two_d, **_axis(ax, "x"), **_axis(ax, "y"), type="scatter", title=title, elements=elements)
    lines = ax.get_lines()
    if lines:
        elements = [{"label": l.get_label(), "points": [[_jsonable(x), _jsonable(y)] for x, y in zip(l.get_xdata(), l.get_ydata())]} for l in lines]
        return dict(two_d, **_axis(ax, "x"), **_axis(ax, "y"), type="line", title=title, elements=elements)
    return {"type": "unknown", "title": title, "elements": []}


def _chart(fig):
    """E2B's e2b/chart of a matplotlib Figure: its Axes' chart, or a
    superchart of several. None when it has no Axes or cannot be read."""
    try:
        axes = fig.get_axes()
        if not axes:
            return None
        if len(axes) == 1:
            return _ax_chart(axes[0])
        sup = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) is not None else ""
        return {"type": "superchart", "title": sup, "elements": [_ax_chart(a) for a in axes]}
    except Exception:
        return None


def _jsonable(v):
    """v as JSON can hold it: numpy scalars as Python numbers, timestamps
    in ISO form, NaN as null."""
    if isinstance(v, float) and v != v:
        return None
    item = getattr(v, "item", None)
    if item is not None and type(v).__module__ == "numpy":
        try:
            return _jsonable(item())
        except Exception:
            pass
    iso = getattr(v, "isoformat", None)
    if iso is not None:
        try:
            return iso()
        except Exception:
            pass
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


def _data(value):
    """E2B's e2b/data of a pandas DataFrame: its columns as lists
    (to_dict(orient="list")), JSON-safe."""
    pd = sys.modules.get("pandas")
    if pd is None or not isinstance(value, pd.DataFrame):
        return None
    try:
        d = value.to_dict(orient="list")
        return {str(k): [_jsonable(x) for x in col] for k, col in d.items()}
    except Exception:
        return None


def _figures():
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    for num in plt.get_fignums():
        fig = plt.figure(num)
        msg = {"type": "result", "text": repr(fig), "png": _png(fig), "extra": {}, "is_main_result": False}
        chart = _chart(fig)
        if chart is not None:
            msg["chart"] = chart
        _emit(msg)
    plt.close("all")


def display(*objs, **_):
    for o in objs:
        _emit(dict(_formats(o), type="result", extra={}, is_main_result=False))


_ns = {"__name__": "__main__", "display": display}


def _run_plain(code):
    """Runs a cell without IPython (a template without it): the last
    expression is the main result."""
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


# MIME types of IPython's display formatter → E2B's result keys
# (e2b-protocol.md); others go to "extra".
_MIME = {"text/plain": "text", "text/html": "html", "text/markdown": "markdown",
         "image/svg+xml": "svg", "image/png": "png", "image/jpeg": "jpeg",
         "application/pdf": "pdf", "text/latex": "latex", "application/json": "json",
         "application/javascript": "javascript", "e2b/data": "data", "e2b/chart": "chart"}


def _result(data, main):
    msg = {"type": "result", "extra": {}, "is_main_result": main}
    for mime, v in data.items():
        key = _MIME.get(mime)
        if key is None:
            msg["extra"][mime] = v
            continue
        if isinstance(v, bytes):
            v = base64.b64encode(v).decode()
        msg[key] = _text(v) if key == "text" else v
    return msg


_shell = None  # the IPython InteractiveShell, when IPython is there


def _ipython():
    """Makes the InteractiveShell cells run in, as E2B's Jupyter kernel
    runs them: IPython's input transformation (dedent, !shell, %magics),
    its display formatter, the last expression as the main result. None
    without IPython."""
    try:
        from IPython.core.interactiveshell import InteractiveShell
        from IPython.core.displayhook import DisplayHook
        from IPython.core.displaypub import DisplayPublisher
        from IPython.core.formatters import BaseFormatter
    except Exception:
        return None

    class Hook(DisplayHook):
        def write_output_prompt(self):
            pass

        def write_format_data(self, format_dict, md_dict=None):
            _emit(_result(format_dict, True))

        def finish_displayhook(self):
            pass

    class Publisher(DisplayPublisher):
        def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **kw):
            _emit(_result(data, False))

        def clear_output(self, wait=False):
            pass

    class DataFormatter(BaseFormatter):
        format_type = "e2b/data"
        print_method = "_repr_e2b_data_"
        _return_type = (dict,)

    class ChartFormatter(BaseFormatter):
        format_type = "e2b/chart"
        print_method = "_repr_e2b_chart_"
        _return_type = (dict,)

    class Shell(InteractiveShell):
        displayhook_class = Hook
        display_pub_class = Publisher

    # Its profile beside the kernel and its history in memory: nothing
    # in the home directory (a prestarted kernel would leave it to an
    # owner who never ran a cell).
    from traitlets.config import Config
    cfg = Config()
    cfg.HistoryManager.hist_file = ":memory:"
    home = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ipython")
    sh = Shell.instance(config=cfg, ipython_dir=home, colors="NoColor", user_ns=_ns)
    sh.display_formatter.formatters["e2b/data"] = DataFormatter(parent=sh.display_formatter)

    def data_fmt(df):
        return _data(df)
    sh.display_formatter.formatters["e2b/data"].for_type_by_name("pandas.core.frame", "DataFrame", data_fmt)
    sh.display_formatter.formatters["image/png"].for_type_by_name("matplotlib.figure", "Figure", _png_bytes)
    sh.display_formatter.formatters["e2b/chart"] = ChartFormatter(parent=sh.display_formatter)
    sh.display_formatter.formatters["e2b/chart"].for_type_by_name("matplotlib.figure", "Figure", _chart)

    def showtraceback(etype, evalue, stb):
        _emit({"type": "error", "name": etype.__name__ if etype else "Error",
               "value": str(evalue), "traceback": "\n".join(stb)})
    sh._showtraceback = showtraceback
    # IPython's own "exit" would end the kernel; E2B's kernel lives on.
    sh.ask_exit = lambda: None
    _patch_pil()
    return sh


def _png_bytes(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()


def _patch_pil():
    """PIL's Image.show() displays the image as a result, as on E2B."""
    try:
        from PIL import Image
        from IPython.display import display as show
    except Exception:
        return
    Image.Image.show = lambda self, *a, **k: show(self)


def _run(code):
    if _shell is None:
        _run_plain(code)
        return
    _shell.run_cell(code, store_history=True)
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        from IPython.display import display as show
        for num in plt.get_fignums():
            show(plt.figure(num))
        plt.close("all")


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
    global _running, _shell
    signal.signal(signal.SIGINT, _sigint)
    requests = _requests()
    prestarted = len(sys.argv) > 2 and sys.argv[1] == "--preload"
    if prestarted:
        _preload([n for n in sys.argv[2].split(",") if n])
    sys.stdout, sys.stderr = _Stream("stdout"), _Stream("stderr")
    _shell = _ipython()
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
