# space's bash kernel for the E2B code interpreter (internal/e2b): one bash
# per code context, so the working directory, variables and functions
# persist across executions. Same protocol as python.py: one JSON request
# per line on stdin ({"id", "code", "env"}); messages as "\x1e" + JSON +
# "\n" on stdout, the request's id in its number_of_executions. The cell
# runs with `source` from a file (a syntax error fails the cell, not the
# kernel), stdin from /dev/null (it cannot eat the commands this driver
# sends bash, nor this driver's requests: bash's stdin is a pipe of its
# own); its output comes back through pipes this driver reads, so stdout,
# stderr and the end of the execution arrive in order.
# A line {"init": {"env": {...}}} is not an execution: the agent writes it
# when the sandbox's identity changes (this kernel's copy in a fork's child
# or in a sandbox made from a checkpoint); bash exports its env.
import codecs, json, os, re, shlex, signal, subprocess, sys, threading

_out = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8", errors="replace")
_lock = threading.Lock()
_END = b"\x1fspace-end\n"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _emit(msg):
    with _lock:
        _out.write("\x1e" + json.dumps(msg) + "\n")
        _out.flush()


class _Pump(threading.Thread):
    """Forwards one of bash's output pipes as messages of kind; sets done
    at each end marker (written after every cell)."""

    def __init__(self, fd, kind):
        super().__init__(daemon=True)
        self.fd, self.kind = fd, kind
        self.done = threading.Semaphore(0)
        self.dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def send(self, data):
        text = self.dec.decode(data)
        if text:
            _emit({"type": self.kind, "text": text})

    def run(self):
        pending = b""
        while True:
            try:
                data = os.read(self.fd, 65536)
            except InterruptedError:
                continue
            if not data:
                self.send(pending)
                return
            pending += data
            while True:
                i = pending.find(_END)
                if i < 0:
                    break
                self.send(pending[:i])
                pending = pending[i + len(_END):]
                self.done.release()
            # Keep what could be the start of a marker; send the rest.
            keep = 0
            for n in range(min(len(_END) - 1, len(pending)), 0, -1):
                if _END.startswith(pending[-n:]):
                    keep = n
                    break
            self.send(pending[:len(pending) - keep])
            pending = pending[len(pending) - keep:]


def main():
    # SIGINT (sent to the process group when the client stopped waiting)
    # is for the cell: bash returns from it (the trap below); this driver
    # ignores it with a handler, not SIG_IGN, which bash would inherit.
    signal.signal(signal.SIGINT, lambda *_: None)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    st_r, st_w = os.pipe()
    bash = subprocess.Popen(["bash", "--noprofile", "--norc"], stdin=subprocess.PIPE, stdout=out_w, stderr=err_w,
                            pass_fds=(st_w,), close_fds=True)
    for fd in (out_w, err_w, st_w):
        os.close(fd)
    status = os.fdopen(st_r, "r")
    pumps = [_Pump(out_r, "stdout"), _Pump(err_r, "stderr")]
    for p in pumps:
        p.start()
    bash.stdin.write(("trap 'return 130' INT\n").encode())
    cells = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bash-%d" % os.getpid())
    os.makedirs(cells, exist_ok=True)
    count = 0
    for line in sys.stdin:
        try:
            req = json.loads(line)
        except ValueError:
            continue
        if not isinstance(req, dict):
            continue
        if "init" in req:
            env = (req["init"] or {}).get("env") or {}
            script = "".join("export %s=%s\n" % (k, shlex.quote(str(v))) for k, v in env.items() if _NAME.match(k))
            try:
                bash.stdin.write(script.encode())
                bash.stdin.flush()
            except BrokenPipeError:
                break
            continue
        count += 1
        start = {"type": "number_of_executions", "execution_count": count}
        if isinstance(req.get("id"), str):
            start["id"] = req["id"]
        _emit(start)
        cell = os.path.join(cells, "cell.sh")
        with open(cell, "w") as f:
            f.write(req.get("code", ""))
        env = {k: v for k, v in (req.get("env") or {}).items() if _NAME.match(k)}
        pre = "".join("__space_prev_%s=$(declare -p %s 2>/dev/null); export %s=%s\n" % (k, k, k, shlex.quote(str(v)))
                      for k, v in env.items())
        post = "".join("unset %s; [ -n \"$__space_prev_%s\" ] && eval \"$__space_prev_%s\"; unset __space_prev_%s\n" % (k, k, k, k)
                       for k in env)
        script = (pre + "source %s </dev/null %d>&-\n__space_rc=$?\n" % (shlex.quote(cell), st_w) + post +
                  "printf '\\037space-end\\n'; printf '\\037space-end\\n' >&2; printf '%%s\\n' \"$__space_rc\" >&%d\n" % st_w)
        try:
            bash.stdin.write(script.encode())
            bash.stdin.flush()
        except BrokenPipeError:
            break
        rc = status.readline()
        if not rc:
            break  # bash exited (the cell ran `exit`): the kernel ends with it
        for p in pumps:
            p.done.acquire()
        rc = rc.strip()
        if rc != "0":
            _emit({"type": "error", "name": "ExitCode", "value": rc,
                   "traceback": "the cell's last command exited with status %s" % rc})
        _emit({"type": "end_of_execution"})
    try:
        bash.stdin.close()  # bash exits; the pumps read its pipes to the end
    except BrokenPipeError:
        pass
    for p in pumps:
        p.join(timeout=1)


main()
