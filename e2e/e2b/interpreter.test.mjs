// @e2b/code-interpreter@2.8.0: runCode (port 49999 semantics), state across
// calls, results, errors, callbacks, code contexts (Python and JavaScript),
// and a matplotlib chart as PNG on the code-interpreter-v1 template.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from '@e2b/code-interpreter'
import { withSandbox } from './lib.mjs'

// The language tests run on `base` (python3 and node); the chart test
// needs the template the SDK asks for by default (space's python-data).
const base = { cls: Sandbox, template: 'base' }

test('runCode: stdout, main result, state across calls, errors', async () => {
  await withSandbox(async (sbx) => {
    const r1 = await sbx.runCode('x = 41\nprint("hello")')
    assert.deepEqual(r1.logs.stdout, ['hello\n'])
    assert.equal(r1.results.length, 0)
    assert.equal(r1.error, undefined)

    const r2 = await sbx.runCode('x + 1')
    assert.equal(r2.text, '42')
    assert.equal(r2.results[0].isMainResult, true)

    const out = []
    const errs = []
    await sbx.runCode('import sys\nprint("a")\nprint("b", file=sys.stderr)', {
      onStdout: (m) => out.push(m.line), onStderr: (m) => errs.push(m.line),
    })
    assert.deepEqual(out, ['a\n'])
    assert.deepEqual(errs, ['b\n'])

    const bad = await sbx.runCode('def f():\n    return undefined_name\nf()')
    assert.equal(bad.error.name, 'NameError')
    assert.match(bad.error.value, /undefined_name/)
    assert.match(bad.error.traceback, /line 2/)
    // The kernel survives an error.
    assert.equal((await sbx.runCode('x')).text, '41')

    const env = await sbx.runCode('import os\nos.environ["ONLY_HERE"]', { envs: { ONLY_HERE: 'yes' } })
    assert.equal(env.text, 'yes')
  }, base)
})

test('code contexts: Python and JavaScript, isolated state, restart, remove', async () => {
  await withSandbox(async (sbx) => {
    const py = await sbx.createCodeContext({ language: 'python' })
    const py2 = await sbx.createCodeContext({ language: 'python', cwd: '/tmp' })
    const js = await sbx.createCodeContext({ language: 'javascript' })
    assert.equal(js.language, 'javascript')
    await sbx.runCode('v = "one"', { context: py })
    await sbx.runCode('v = "two"', { context: py2 })
    assert.equal((await sbx.runCode('v', { context: py })).text, 'one')
    assert.equal((await sbx.runCode('import os\nos.getcwd()', { context: py2 })).text, '/tmp')

    await sbx.runCode('globalThis.n = 20; let m = 1', { context: js })
    const r = await sbx.runCode('console.log("from js"); n + m + 21', { context: js })
    assert.deepEqual(r.logs.stdout, ['from js\n'])
    assert.equal(r.text, '42')
    const jsErr = await sbx.runCode('nope()', { context: js })
    assert.equal(jsErr.error.name, 'ReferenceError')
    // language without a context: the default JavaScript context
    assert.equal((await sbx.runCode('[1,2,3].length', { language: 'javascript' })).text, '3')

    const ids = (await sbx.listCodeContexts()).map((c) => c.id)
    for (const c of [py, py2, js]) assert.ok(ids.includes(c.id))

    await sbx.restartCodeContext(py)
    const lost = await sbx.runCode('v', { context: py })
    assert.equal(lost.error.name, 'NameError')

    await sbx.removeCodeContext(py2)
    assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === py2.id))
  }, base)
})

test('a cell whose client stopped waiting is interrupted; the context answers again', async () => {
  await withSandbox(async (sbx) => {
    await sbx.runCode('kept = "state"')
    // It used to keep running: every later runCode in the context hung.
    await assert.rejects(sbx.runCode('import time\nwhile True: time.sleep(0.01)', { timeoutMs: 1500 }), /timed out/)
    const r = await sbx.runCode('kept')
    assert.equal(r.text, 'state')
    assert.equal(r.error, undefined)

    const js = await sbx.createCodeContext({ language: 'javascript' })
    await sbx.runCode('globalThis.k = 7', { context: js })
    await assert.rejects(sbx.runCode('while (true) {}', { context: js, timeoutMs: 1500 }), /timed out/)
    assert.equal((await sbx.runCode('k * 6', { context: js })).text, '42')

    // A cell that ignores SIGINT costs its kernel (state lost), not the context.
    await assert.rejects(sbx.runCode('import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass', { timeoutMs: 1500 }), /timed out/)
    assert.equal((await sbx.runCode('1 + 1')).text, '2')
    assert.equal((await sbx.runCode('kept')).error.name, 'NameError')
  }, base)
})

test('bash: state across cells, stdout and stderr, exit status, envs, interrupt', async () => {
  await withSandbox(async (sbx) => {
    const bash = { language: 'bash' }
    const r1 = await sbx.runCode('cd /tmp && X=41 && echo "in $(pwd)"', bash)
    assert.equal(r1.logs.stdout.join(''), 'in /tmp\n')
    assert.equal(r1.error, undefined)
    const r2 = await sbx.runCode('echo $((X + 1)); pwd; echo oops >&2', bash)
    assert.equal(r2.logs.stdout.join(''), '42\n/tmp\n')
    assert.equal(r2.logs.stderr.join(''), 'oops\n')
    const bad = await sbx.runCode('ls /nonexistent', bash)
    assert.equal(bad.error.name, 'ExitCode')
    assert.equal(bad.error.value, '2')
    assert.match(bad.logs.stderr.join(''), /nonexistent/)
    const env = await sbx.runCode('echo "$ONLY_HERE"', { ...bash, envs: { ONLY_HERE: 'yes' } })
    assert.equal(env.logs.stdout.join(''), 'yes\n')
    assert.equal((await sbx.runCode('echo "[$ONLY_HERE]"', bash)).logs.stdout.join(''), '[]\n')
    await assert.rejects(sbx.runCode('while true; do sleep 1; done', { ...bash, timeoutMs: 1500 }), /timed out/)
    assert.equal((await sbx.runCode('echo $X', bash)).logs.stdout.join(''), '41\n')
  }, base)
})

test('kernels: a cell\'s env stays, subprocesses leave the requests alone, long lines, bad envs, a killed kernel', async () => {
  await withSandbox(async (sbx) => {
    // What a cell sets in the environment stays, as in Jupyter; the
    // request's envs are for their cell only.
    await sbx.runCode('import os\nos.environ["SET_IN_CELL"] = "kept"', { envs: { ONLY_HERE: 'yes' } })
    const env = await sbx.runCode('import os\nf"{os.environ.get(\'SET_IN_CELL\')} {os.environ.get(\'ONLY_HERE\', \'-\')}"')
    assert.equal(env.text, 'kept -')
    const js = await sbx.createCodeContext({ language: 'javascript' })
    await sbx.runCode('process.env.SET_IN_CELL = "kept"', { context: js, envs: { ONLY_HERE: 'yes' } })
    assert.equal((await sbx.runCode('`${process.env.SET_IN_CELL} ${process.env.ONLY_HERE ?? "-"}`', { context: js })).text, 'kept -')

    // A subprocess inherits the kernel's stdin, which is not where the
    // requests come from: cat reads end-of-file, not the next cell.
    await sbx.runCode('import subprocess\np = subprocess.Popen(["cat"])')
    assert.equal((await sbx.runCode('p.wait(5)', { timeoutMs: 20000 })).text, '0')

    // Output without a newline comes in pieces, all of it.
    const long = await sbx.runCode('import os\nwith os.fdopen(1, "wb", closefd=False) as f:\n    f.write(b"x" * (3 << 20))')
    assert.equal(long.logs.stdout.join('').length, 3 << 20)
    assert.ok(long.logs.stdout.length > 1, `${long.logs.stdout.length} piece`)

    // env_vars a kernel cannot hold are the request's error, not the kernel's end.
    await assert.rejects(sbx.runCode('1', { envs: { 'A=B': 'x' } }), /400/)
    assert.equal((await sbx.runCode('os.environ["SET_IN_CELL"]')).text, 'kept')

    // A kernel killed between cells: the next cell runs in a fresh one
    // (as Jupyter restarts a dead kernel), without the old one's state.
    // (Kernels run as root, as E2B's do.)
    const pid = (await sbx.runCode('os.getpid()')).text
    await sbx.commands.run(`kill -9 ${pid}`, { user: 'root' })
    const fresh = await sbx.runCode('import os\nos.getpid()')
    assert.ok(fresh.text && fresh.text !== pid, JSON.stringify(fresh))
    assert.equal((await sbx.runCode('p')).error?.name, 'NameError')
    assert.equal((await sbx.runCode('1 + 1')).text, '2')
  }, base)
})

test("a fork's child: every kind of context keeps its state, counts on, takes the child's env", { timeout: 180000 }, async () => {
  await withSandbox(async (sbx) => {
    const py = await sbx.createCodeContext({ language: 'python' })
    const js = await sbx.createCodeContext({ language: 'javascript' })
    const sh = await sbx.createCodeContext({ language: 'bash' })
    await sbx.runCode('x = 1', { context: py })
    await sbx.runCode('globalThis.x = 1', { context: js })
    // bash keeps an unset; the child's identity brings TENANT back.
    await sbx.runCode('X=1; unset TENANT', { context: sh })
    const [child] = await sbx.fork({ count: 1 })
    assert.ok(!(child instanceof Error), String(child))
    try {
      const c = await Sandbox.connect(child.sandboxId)
      const ctx = async (want) => (await c.listCodeContexts()).find((x) => x.id === want.id)
      // Two cells each: the first one read after the fork, and the next.
      for (let i = 0; i < 2; i++) {
        const p = await c.runCode('import os\nf"{x} {os.environ[\'TENANT\']}"', { context: await ctx(py) })
        assert.equal(p.text, '1 alpha', JSON.stringify(p))
        assert.equal(p.executionCount, 2 + i, 'python')
        const j = await c.runCode('`${x} ${process.env.TENANT}`', { context: await ctx(js) })
        assert.equal(j.text, '1 alpha', JSON.stringify(j))
        assert.equal(j.executionCount, 2 + i, 'javascript')
        const b = await c.runCode('echo "$X $TENANT"', { context: await ctx(sh) })
        assert.equal(b.logs.stdout.join(''), '1 alpha\n', JSON.stringify(b))
        assert.equal(b.executionCount, 2 + i, 'bash')
      }
      assert.equal((await sbx.runCode('echo "[$TENANT]"', { context: sh })).logs.stdout.join(''), '[]\n', 'the parent kept its unset')
    } finally {
      await child.kill()
    }
  }, { ...base, opts: { envs: { TENANT: 'alpha' } } })
})

test('matplotlib chart comes back as PNG (code-interpreter-v1)', { timeout: 180000 }, async () => {
  await withSandbox(async (sbx) => {
    const r = await sbx.runCode([
      'import matplotlib.pyplot as plt',
      'plt.plot([1, 2, 3], [1, 4, 9])',
      'plt.title("squares")',
      'plt.show()',
    ].join('\n'))
    assert.equal(r.error, undefined, r.error && r.error.traceback)
    const png = r.results.find((x) => x.png)
    assert.ok(png, `no png in ${JSON.stringify(r.results.map((x) => Object.keys(x)))}`)
    assert.equal(Buffer.from(png.png, 'base64').subarray(1, 4).toString(), 'PNG')
  }, { cls: Sandbox })
})
