// pty.*: create, sendInput with echo, resize, kill.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { withSandbox, waitFor } from './lib.mjs'

test('pty create/sendInput/resize/kill', async () => {
  await withSandbox(async (sbx) => {
    let out = ''
    const dec = new TextDecoder()
    const term = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += dec.decode(d) } })
    assert.ok(term.pid > 0)
    await sbx.pty.sendInput(term.pid, new TextEncoder().encode('echo pty-$((40+2))\n'))
    await waitFor(() => out.includes('pty-42'), 20000, 'pty echo')
    await sbx.pty.resize(term.pid, { cols: 100, rows: 30 })
    await sbx.pty.sendInput(term.pid, new TextEncoder().encode('stty size\n'))
    await waitFor(() => out.includes('30 100'), 20000, 'new size')
    assert.equal(await sbx.pty.kill(term.pid), true)
    const r = await term.wait().catch((e) => e)
    assert.equal(r.exitCode, -1)
  })
})
