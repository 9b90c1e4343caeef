// E2B parity (issue 32): behaviours programs written for E2B notice —
// connect never shortens a sandbox's life, list order and paging,
// template aliases, sudo, watch events of an overwrite, files.remove of a
// missing path, absolute symlink targets, errors of calls cut short by a
// kill, metrics ranges, files-only pause.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, Template, TimeoutError, FilesystemEventType } from 'e2b'
import { Sandbox as OldSandbox } from 'e2b-old'
import { Sandbox as CodeInterpreter } from '@e2b/code-interpreter'
import { withSandbox, waitFor, runId } from './lib.mjs'

const msAway = (d) => d.getTime() - Date.now()

test('connect only ever extends the end time', async () => {
  await withSandbox(async (sbx) => {
    const hour = msAway((await sbx.getInfo()).endAt)
    assert.ok(hour > 3500_000, `created with an hour: ${hour} ms left`)

    // A shorter timeout on connect changes nothing: the current SDK with
    // timeoutMs, the old one with its default 300 s.
    await Sandbox.connect(sbx.sandboxId, { timeoutMs: 60_000 })
    await OldSandbox.connect(sbx.sandboxId)
    await sbx.connect({ timeoutMs: 1_000 })
    const after = msAway((await sbx.getInfo()).endAt)
    assert.ok(after > 3400_000, `a shorter connect cut the sandbox's life to ${after} ms`)

    // A longer one extends it.
    await Sandbox.connect(sbx.sandboxId, { timeoutMs: 7200_000 })
    const longer = msAway((await sbx.getInfo()).endAt)
    assert.ok(longer > 7100_000 && longer <= 7200_000, `connect with 2 h: ${longer} ms left`)

    // setTimeout is not connect: it sets the end time, shorter too.
    await sbx.setTimeout(120_000)
    const set = msAway((await sbx.getInfo()).endAt)
    assert.ok(set > 60_000 && set <= 120_000, `setTimeout(2 min): ${set} ms left`)
  }, { opts: { timeoutMs: 3600_000 } })
})

test('Sandbox.list: newest first, pages with limit and nextToken in that order', async () => {
  const tag = `order-${runId}`
  const made = []
  try {
    for (let i = 0; i < 3; i++) {
      made.push(await Sandbox.create({ metadata: { suite: tag } }))
    }
    const ids = made.map((s) => s.sandboxId)
    const newest = [...ids].reverse()
    const all = async (opts) => {
      const seen = []
      const pager = Sandbox.list({ query: { metadata: { suite: tag } }, ...opts })
      let pages = 0
      while (pager.hasNext && pages < 10) {
        seen.push(...(await pager.nextItems()).map((s) => s.sandboxId))
        pages++
      }
      return { seen, pages }
    }
    const one = await all({ limit: 1 })
    assert.deepEqual(one.seen, newest)
    assert.equal(one.pages, 3)
    assert.deepEqual((await all({ limit: 2 })).seen, newest)
    assert.deepEqual((await all({ limit: 2, order: 'asc' })).seen, ids)
    assert.deepEqual((await all({})).seen, newest)

    // startedAfter and template filter the whole list before paging.
    const info = await made[1].getInfo()
    const later = await all({ limit: 1, query: { metadata: { suite: tag }, startedAfter: info.startedAt } })
    assert.deepEqual(later.seen, [ids[2], ids[1]])
    assert.deepEqual((await all({ limit: 1, query: { metadata: { suite: tag }, template: 'base' } })).seen, newest)
    assert.deepEqual((await all({ query: { metadata: { suite: tag }, template: 'code-interpreter-v1' } })).seen, [])

    // A page token from one page continues from there.
    const first = Sandbox.list({ query: { metadata: { suite: tag } }, limit: 1 })
    await first.nextItems()
    const rest = await Sandbox.list({ query: { metadata: { suite: tag } }, limit: 5, nextToken: first.nextToken }).nextItems()
    assert.deepEqual(rest.map((s) => s.sandboxId), newest.slice(1))
  } finally {
    await Promise.all(made.map((s) => s.kill().catch(() => {})))
  }
})
