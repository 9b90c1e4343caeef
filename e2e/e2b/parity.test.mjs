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

test('Template.exists: the server\'s templates and E2B\'s aliases of them', async () => {
  assert.equal(await Template.exists('base'), true)
  assert.equal(await Template.exists('code-interpreter-v1'), true)
  assert.equal(await Template.exists('python-data'), true)
  assert.equal(await Template.exists(`no-such-template-${runId}`), false)
})

test('the sandbox user has passwordless sudo', async () => {
  await withSandbox(async (sbx) => {
    const r = await sbx.commands.run('whoami; sudo -n whoami; sudo -n id -u; sudo -n sh -c "echo ok > /root/sudo.txt" && sudo -n cat /root/sudo.txt')
    assert.equal(r.stdout, 'user\nroot\n0\nok\n')
  })
})

test('watchDir: files.write over a file is a write of it, no temporary file is seen', async () => {
  await withSandbox(async (sbx) => {
    await sbx.files.write('/tmp/wo/a.txt', 'one')
    const events = []
    const handle = await sbx.files.watchDir('/tmp/wo', (e) => { events.push(e) })
    await sbx.files.write('/tmp/wo/a.txt', 'two')
    await waitFor(() => events.some((e) => e.name === 'a.txt' && e.type === FilesystemEventType.WRITE), 20000, 'write a.txt')
    await sbx.files.write('/tmp/wo/new.txt', 'n')
    await waitFor(() => events.some((e) => e.name === 'new.txt' && e.type === FilesystemEventType.WRITE), 20000, 'write new.txt')
    await handle.stop()
    const seen = events.map((e) => `${e.type} ${e.name}`)
    assert.ok(!seen.some((s) => s.includes('.space-')), `temporary files: ${seen}`)
    assert.deepEqual(seen, [
      `${FilesystemEventType.WRITE} a.txt`,
      `${FilesystemEventType.CREATE} new.txt`, `${FilesystemEventType.WRITE} new.txt`,
    ])
    assert.equal(await sbx.files.read('/tmp/wo/a.txt'), 'two')
  })
})

test('files.remove of a missing path succeeds; getInfo gives an absolute symlinkTarget', async () => {
  await withSandbox(async (sbx) => {
    await sbx.files.remove('/tmp/never-there')
    await sbx.files.remove('/tmp/never/there/either')
    await sbx.files.write('/tmp/ln/t.txt', 'x')
    await sbx.commands.run('cd /tmp/ln && ln -s t.txt rel && ln -s ../ln/t.txt up && ln -s /tmp/ln/t.txt abs')
    for (const name of ['rel', 'up', 'abs']) {
      const info = await sbx.files.getInfo(`/tmp/ln/${name}`)
      assert.equal(info.symlinkTarget, '/tmp/ln/t.txt', name)
    }
    await sbx.files.remove('/tmp/ln')
    assert.equal(await sbx.files.exists('/tmp/ln'), false)
  })
})

// The SDKs' own sign of a sandbox killed under a request: the connection
// drops, envd's /health says it is not running, and they raise
// TimeoutError saying so.
const killedError = (err) => {
  assert.equal(err.name, 'TimeoutError', String(err))
  assert.match(err.message, /killed/)
  return true
}

test('a command waited on while its sandbox is killed: the SDK\'s TimeoutError', async () => {
  const sbx = await Sandbox.create()
  try {
    const fg = sbx.commands.run('sleep 600')
    const bg = await sbx.commands.run('sleep 601', { background: true })
    await waitFor(async () => (await sbx.commands.list()).some((p) => p.args.includes('sleep 600')), 20000, 'sleep 600 to run')
    assert.equal(await Sandbox.kill(sbx.sandboxId), true)
    await assert.rejects(fg, (err) => {
      assert.ok(err instanceof TimeoutError, String(err))
      assert.match(err.message, /killed or reached its end of life/)
      return true
    })
    await assert.rejects(bg.wait(), killedError)
  } finally {
    await sbx.kill().catch(() => {})
  }
})

test('runCode while its sandbox is killed fails, not an empty execution', { timeout: 120000 }, async () => {
  const sbx = await CodeInterpreter.create()
  try {
    assert.equal((await sbx.runCode('1 + 1')).text, '2')
    let started = false
    const cell = sbx.runCode('import time\nprint("sleeping", flush=True)\ntime.sleep(600)', { onStdout: () => { started = true } })
    await waitFor(() => started, 20000, 'the cell to start')
    assert.equal(await CodeInterpreter.kill(sbx.sandboxId), true)
    await assert.rejects(cell, killedError)
  } finally {
    await sbx.kill().catch(() => {})
  }
})

test('getMetrics({start, end}): the samples in the range, with CPU, memory and disk', { timeout: 120000 }, async () => {
  await withSandbox(async (sbx) => {
    const t0 = new Date()
    await sbx.commands.run('head -c 20000000 /dev/urandom > /home/user/blob')
    await sbx.commands.run('timeout 12 sh -c "while :; do :; done"', { background: true })
    await new Promise((r) => setTimeout(r, 13000))
    const t1 = new Date()
    const all = await sbx.getMetrics({ start: t0, end: t1 })
    assert.ok(all.length >= 2, `samples in 13 s: ${JSON.stringify(all)}`)
    for (let i = 0; i < all.length; i++) {
      const m = all[i]
      assert.ok(m.timestamp.getTime() >= t0.getTime() - 1000 && m.timestamp.getTime() <= t1.getTime() + 1000, `${m.timestamp} outside [${t0}, ${t1}]`)
      if (i > 0) assert.ok(m.timestamp >= all[i - 1].timestamp, 'oldest first')
      assert.equal(m.cpuCount, 1)
      assert.ok(m.memTotal > 0 && m.memUsed > 0 && m.diskTotal > 0 && m.diskUsed > 0, JSON.stringify(m))
    }
    assert.ok(all.some((m) => m.cpuUsedPct > 0), `a busy loop ran: ${JSON.stringify(all)}`)
    assert.ok(all[all.length - 1].diskUsed > 20000000, `the 20 MB blob: ${JSON.stringify(all)}`)

    // The range is honoured: the first seconds only, and nothing before
    // the sandbox was made.
    const early = await sbx.getMetrics({ start: t0, end: new Date(t0.getTime() + 6000) })
    assert.ok(early.length >= 1 && early.length < all.length, `first 6 s: ${early.length} of ${all.length}`)
    assert.ok(early.every((m) => m.timestamp.getTime() <= t0.getTime() + 7000))
    assert.deepEqual(await sbx.getMetrics({ start: new Date(t0.getTime() - 3600_000), end: new Date(t0.getTime() - 1800_000) }), [])
    // Without a range: one sample, now.
    const [now] = await sbx.getMetrics()
    assert.ok(Math.abs(now.timestamp.getTime() - Date.now()) < 5000)
  })
})

test('pause({keepMemory: false}): files kept, the resume boots fresh', { timeout: 240000 }, async () => {
  await withSandbox(async (sbx) => {
    await sbx.files.write('/home/user/kept.txt', 'kept')
    await sbx.commands.run('mkdir -p /home/user/d && echo deep > /home/user/d/e.txt && rm -f /home/user/.bashrc')
    const bootId = async (s) => (await s.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout
    const boot = await bootId(sbx)
    const bg = await sbx.commands.run('sleep 600', { background: true })
    assert.equal(await sbx.pause({ keepMemory: false }), true)
    assert.equal((await sbx.getInfo()).state, 'paused')
    assert.equal(await sbx.pause({ keepMemory: false }), false) // already paused

    const again = await Sandbox.connect(sbx.sandboxId)
    assert.equal((await again.getInfo()).state, 'running')
    assert.equal(await again.files.read('/home/user/kept.txt'), 'kept')
    assert.equal(await again.files.read('/home/user/d/e.txt'), 'deep\n')
    assert.equal(await again.files.exists('/home/user/.bashrc'), false)
    assert.notEqual(await bootId(again), boot)
    const procs = await again.commands.list()
    assert.ok(!procs.some((p) => p.args.includes('sleep 600')), `sleep ${bg.pid} outlived a files-only pause: ${JSON.stringify(procs)}`)
    assert.equal((await again.commands.run('echo alive; whoami')).stdout, 'alive\nuser\n')
  })
})
