// e2b@2.50.0 uses the old paths: POST /sandboxes and POST /sandboxes/{id}/connect.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, CommandExitError } from 'e2b-old'
import { withSandbox } from './lib.mjs'

test('e2b@2.50.0: create, run, files, pause and connect, kill', { timeout: 180000 }, async () => {
  await withSandbox(async (sbx) => {
    const r = await sbx.commands.run('echo old')
    assert.equal(r.stdout, 'old\n')
    await assert.rejects(sbx.commands.run('exit 1'), CommandExitError)
    await sbx.files.write('/tmp/o.txt', 'o')
    assert.equal(await sbx.files.read('/tmp/o.txt'), 'o')
    assert.equal(await sbx.betaPause(), true)
    const again = await Sandbox.connect(sbx.sandboxId)
    assert.equal(await again.files.read('/tmp/o.txt'), 'o')
  }, { cls: Sandbox })
})
