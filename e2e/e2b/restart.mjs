// The two halves of e2e/e2b_test.go's TestE2BAcrossRestart, run with the
// unmodified SDK on either side of a server restart:
//   node restart.mjs before          → prints {"id", "py", "js"}
//   node restart.mjs after '<json>'  → code contexts, their state and the
//                                      default context survived; a fork's
//                                      child carries them too
import assert from 'node:assert/strict'
import { Sandbox } from '@e2b/code-interpreter'

const phase = process.argv[2]

if (phase === 'before') {
  const sbx = await Sandbox.create('code-interpreter-v1', { timeoutMs: 600_000 })
  const py = await sbx.createCodeContext({ language: 'python', cwd: '/tmp' })
  const js = await sbx.createCodeContext({ language: 'javascript' })
  assert.equal((await sbx.runCode('v = 41\nv', { context: py })).text, '41')
  await sbx.runCode('globalThis.n = 7', { context: js })
  await sbx.runCode('w = "default"')
  console.log(JSON.stringify({ id: sbx.sandboxId, py: py.id, js: js.id }))
} else if (phase === 'after') {
  const { id, py, js } = JSON.parse(process.argv[3])
  const sbx = await Sandbox.connect(id)
  await check(sbx, py, js, 'after the restart')

  const [child] = await sbx.fork({ count: 1 })
  assert.ok(!(child instanceof Error), String(child))
  try {
    const c = await Sandbox.connect(child.sandboxId)
    await check(c, py, js, 'in the fork')
    // Independent state: the child's change does not reach the parent.
    await c.runCode('v = 100', { context: (await c.listCodeContexts()).find((x) => x.id === py) })
    assert.equal((await sbx.runCode('v', { context: (await sbx.listCodeContexts()).find((x) => x.id === py) })).text, '41')
  } finally {
    await child.kill()
  }
  await sbx.kill()
} else {
  throw new Error(`usage: restart.mjs before | after <json>`)
}

async function check(sbx, py, js, where) {
  const listed = await sbx.listCodeContexts()
  const pyCtx = listed.find((c) => c.id === py)
  const jsCtx = listed.find((c) => c.id === js)
  assert.ok(pyCtx && jsCtx, `${where}: contexts ${JSON.stringify(listed)}`)
  assert.equal(pyCtx.cwd, '/tmp', where)
  assert.equal(jsCtx.language, 'javascript', where)
  const r = await sbx.runCode('print("out")\nv + 1', { context: pyCtx })
  assert.equal(r.text, '42', `${where}: ${JSON.stringify(r)}`)
  assert.deepEqual(r.logs.stdout, ['out\n'], `${where}: only this execution's output`)
  assert.equal((await sbx.runCode('n * 6', { context: jsCtx })).text, '42', where)
  assert.equal((await sbx.runCode('w')).text, 'default', `${where}: the default context`)
}
