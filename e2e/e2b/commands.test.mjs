// commands.*: foreground, errors, background with stdin, reconnect by pid.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { CommandExitError } from 'e2b'
import { withSandbox, waitFor } from './lib.mjs'

test('commands.run foreground: stdout, stderr, exit code, env, cwd', async () => {
  await withSandbox(async (sbx) => {
    const r = await sbx.commands.run('echo hi; echo oops >&2')
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'hi\n')
    assert.equal(r.stderr, 'oops\n')

    const env = await sbx.commands.run('echo $GREETING; pwd; whoami', { envs: { GREETING: 'hello' }, cwd: '/tmp' })
    assert.equal(env.stdout, 'hello\n/tmp\nuser\n')

    let streamed = ''
    await sbx.commands.run('for i in 1 2 3; do echo line$i; done', { onStdout: (d) => { streamed += d } })
    assert.equal(streamed, 'line1\nline2\nline3\n')
  })
})

test('commands.run non-zero exit throws CommandExitError', async () => {
  await withSandbox(async (sbx) => {
    await assert.rejects(sbx.commands.run('echo out; echo bad >&2; exit 3'), (err) => {
      assert.ok(err instanceof CommandExitError, `got ${err}`)
      assert.equal(err.exitCode, 3)
      assert.equal(err.stdout, 'out\n')
      assert.equal(err.stderr, 'bad\n')
      return true
    })
  })
})

test('background command: onStdout, sendStdin, list, connect by pid, kill', async () => {
  await withSandbox(async (sbx) => {
    let out = ''
    const h = await sbx.commands.run('while read line; do echo got:$line; done', {
      background: true, stdin: true, onStdout: (d) => { out += d },
    })
    assert.ok(h.pid > 0)
    await sbx.commands.sendStdin(h.pid, 'one\n')
    await waitFor(() => out.includes('got:one'), 20000, 'echo of stdin')

    const procs = await sbx.commands.list()
    assert.ok(procs.some((p) => p.pid === h.pid), `pid ${h.pid} not in ${JSON.stringify(procs)}`)

    // A second client re-attaches by pid and sees the output.
    let again = ''
    const h2 = await sbx.commands.connect(h.pid, { onStdout: (d) => { again += d } })
    await sbx.commands.sendStdin(h.pid, 'two\n')
    await waitFor(() => again.includes('got:two'), 20000, 'output on the reconnected handle')
    await waitFor(() => out.includes('got:two'), 20000, 'output on the first handle')

    assert.equal(await sbx.commands.kill(h.pid), true)
    await assert.rejects(h.wait(), CommandExitError)
    await assert.rejects(h2.wait(), CommandExitError)
    assert.equal(await sbx.commands.kill(999999), false)
  })
})

test('commands.closeStdin ends input', async () => {
  await withSandbox(async (sbx) => {
    const h = await sbx.commands.run('cat; echo done', { background: true, stdin: true })
    await sbx.commands.sendStdin(h.pid, 'abc\n')
    await sbx.commands.closeStdin(h.pid)
    const r = await h.wait()
    assert.equal(r.stdout, 'abc\ndone\n')
  })
})
