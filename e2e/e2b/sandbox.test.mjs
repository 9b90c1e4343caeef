// Sandbox lifecycle: create, getInfo, setTimeout, list (filters, paging),
// kill, errors, tenancy, metrics, pause/resume, snapshots, fork, network.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, SandboxNotFoundError } from 'e2b'
import { withSandbox, runId } from './lib.mjs'

test('create, getInfo, setTimeout, isRunning, metadata, envVars', async () => {
  await withSandbox(async (sbx) => {
    assert.match(sbx.sandboxId, /^[a-z0-9]+$/)
    const info = await sbx.getInfo()
    assert.equal(info.sandboxId, sbx.sandboxId)
    assert.equal(info.templateId, 'base')
    assert.equal(info.state, 'running')
    assert.deepEqual(info.metadata, { suite: runId, kind: 'info' })
    const r = await sbx.commands.run('echo $FROM_CREATE')
    assert.equal(r.stdout, 'from-create\n')
    assert.equal(await sbx.isRunning(), true)

    await sbx.setTimeout(600_000)
    const after = await sbx.getInfo()
    const left = after.endAt.getTime() - Date.now()
    assert.ok(left > 550_000 && left <= 600_000, `endAt ${after.endAt} is ${left} ms away`)
  }, { opts: { metadata: { suite: runId, kind: 'info' }, envs: { FROM_CREATE: 'from-create' } } })
})

test('Sandbox.list filters by metadata and state and pages with X-Next-Token', async () => {
  const tag = `list-${runId}`
  const a = await Sandbox.create({ metadata: { suite: tag } })
  const b = await Sandbox.create({ metadata: { suite: tag } })
  try {
    const seen = []
    const pager = Sandbox.list({ query: { metadata: { suite: tag }, state: ['running'] }, limit: 1 })
    let pages = 0
    while (pager.hasNext) {
      const items = await pager.nextItems()
      pages++
      seen.push(...items.map((s) => s.sandboxId))
      if (pages > 5) break
    }
    assert.deepEqual(seen.sort(), [a.sandboxId, b.sandboxId].sort())
    assert.ok(pages >= 2, `one item per page, got ${pages} pages`)

    const paused = await Sandbox.list({ query: { metadata: { suite: tag }, state: ['paused'] } }).nextItems()
    assert.equal(paused.length, 0)
  } finally {
    await a.kill()
    await b.kill()
  }
})

test('kill(), kill of an unknown id is false, SandboxNotFoundError', async () => {
  const sbx = await Sandbox.create()
  assert.equal(await sbx.kill(), true)
  assert.equal(await Sandbox.kill(sbx.sandboxId), false)
  assert.equal(await Sandbox.kill('doesnotexist'), false)
  await assert.rejects(Sandbox.connect(sbx.sandboxId), SandboxNotFoundError)
  await assert.rejects(Sandbox.connect('doesnotexist'), SandboxNotFoundError)
  await assert.rejects(Sandbox.getInfo('doesnotexist'), SandboxNotFoundError)
})

test('a key sees only its own team\'s sandboxes', { skip: !process.env.E2B_OTHER_API_KEY }, async () => {
  await withSandbox(async (sbx) => {
    const other = { apiKey: process.env.E2B_OTHER_API_KEY }
    await assert.rejects(Sandbox.connect(sbx.sandboxId, other), SandboxNotFoundError)
    assert.equal(await Sandbox.kill(sbx.sandboxId, other), false)
    const listed = await Sandbox.list({ ...other, query: { metadata: { suite: runId } } }).nextItems()
    assert.ok(!listed.some((s) => s.sandboxId === sbx.sandboxId))
    assert.equal(await sbx.isRunning(), true)
  }, { opts: { metadata: { suite: runId } } })
})

test('getMetrics: CPU, memory and disk from the guest', async () => {
  await withSandbox(async (sbx) => {
    const m = await sbx.getMetrics()
    assert.ok(m.length >= 1)
    assert.ok(m[0].memTotal > 0 && m[0].memUsed > 0 && m[0].memUsed <= m[0].memTotal, JSON.stringify(m[0]))
    assert.equal(m[0].cpuCount, 1)
    assert.ok(m[0].cpuUsedPct >= 0 && m[0].cpuUsedPct <= 100, JSON.stringify(m[0]))
    assert.ok(m[0].diskTotal > 0, JSON.stringify(m[0]))

    await sbx.commands.run('head -c 20000000 /dev/urandom > /home/user/blob')
    const busy = await sbx.commands.run('timeout 5 sh -c "while :; do :; done"', { background: true })
    await new Promise((r) => setTimeout(r, 1000))
    const [after] = await sbx.getMetrics()
    await busy.kill()
    assert.ok(after.diskUsed >= m[0].diskUsed + 20000000, `disk: ${JSON.stringify(m[0])} → ${JSON.stringify(after)}`)
    assert.ok(after.cpuUsedPct > 0, `a busy loop: ${JSON.stringify(after)}`)
  })
})

test('pause, then connect resumes with files and processes intact', { timeout: 180000 }, async () => {
  await withSandbox(async (sbx) => {
    await sbx.files.write('/home/user/keep.txt', 'kept')
    const bg = await sbx.commands.run('sleep 600', { background: true })
    assert.equal(await sbx.betaPause(), true)
    assert.equal((await sbx.getInfo()).state, 'paused')
    assert.equal(await sbx.pause(), false) // already paused

    const again = await Sandbox.connect(sbx.sandboxId)
    assert.equal((await again.getInfo()).state, 'running')
    assert.equal(await again.files.read('/home/user/keep.txt'), 'kept')
    const procs = await again.commands.list()
    assert.ok(procs.some((p) => p.pid === bg.pid), `sleep ${bg.pid} survived: ${JSON.stringify(procs)}`)
    assert.equal((await again.commands.run('echo alive')).stdout, 'alive\n')

    // connect() of a running sandbox is a no-op
    await sbx.connect()
    assert.equal((await sbx.getInfo()).state, 'running')
  })
})

test('lifecycle autoResume: a paused sandbox wakes for a command', { timeout: 180000 }, async () => {
  await withSandbox(async (sbx) => {
    const info = await sbx.getInfo()
    assert.deepEqual(info.lifecycle, { onTimeout: 'pause', autoResume: true })
    await sbx.files.write('/home/user/woken.txt', 'before')
    assert.equal(await sbx.betaPause(), true)
    assert.equal((await sbx.getInfo()).state, 'paused')
    // No connect(): the command itself resumes the sandbox.
    assert.equal((await sbx.commands.run('cat /home/user/woken.txt')).stdout, 'before')
    assert.equal((await sbx.getInfo()).state, 'running')
  }, { opts: { lifecycle: { onTimeout: 'pause', autoResume: true } } })
  // autoResume needs onTimeout 'pause' (the SDK says so before asking).
  await assert.rejects(Sandbox.create({ lifecycle: { onTimeout: 'kill', autoResume: true } }), /autoResume/)
})

test('createSnapshot, listSnapshots, create from a snapshot, fork', { timeout: 300000 }, async () => {
  await withSandbox(async (sbx) => {
    await sbx.files.write('/home/user/f.txt', 'parent')
    const snap = await sbx.createSnapshot({ name: `snap-${runId}` })
    assert.match(snap.snapshotId, /^snap-/)
    const listed = await sbx.listSnapshots().nextItems()
    assert.ok(listed.some((s) => s.snapshotId === snap.snapshotId), JSON.stringify(listed))

    const fromSnap = await Sandbox.create(snap.snapshotId)
    try {
      assert.equal(await fromSnap.files.read('/home/user/f.txt'), 'parent')
    } finally {
      await fromSnap.kill()
    }

    const [child] = await sbx.fork({ count: 1 })
    assert.ok(!(child instanceof Error), String(child))
    try {
      assert.notEqual(child.sandboxId, sbx.sandboxId)
      assert.equal(await child.files.read('/home/user/f.txt'), 'parent')
      await child.files.write('/home/user/f.txt', 'child')
      assert.equal(await sbx.files.read('/home/user/f.txt'), 'parent')
      assert.equal(await child.files.read('/home/user/f.txt'), 'child')
    } finally {
      await child.kill()
    }
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
  })
})

test('network options map onto the egress policy', async () => {
  await withSandbox(async (sbx) => {
    const info = await sbx.getInfo()
    assert.equal(info.allowInternetAccess, false)
    await sbx.updateNetwork({ allowOut: ['example.com'] })
    const after = await sbx.getInfo()
    assert.deepEqual(after.network.allowOut, ['example.com'])
    // Taking everything away again (it answered 400: a deny list of "*").
    await sbx.updateNetwork({ allowInternetAccess: false })
    const closed = await sbx.getInfo()
    assert.equal(closed.allowInternetAccess, false)
    assert.deepEqual(closed.network?.allowOut ?? [], [])
  }, { opts: { allowInternetAccess: false } })
})
