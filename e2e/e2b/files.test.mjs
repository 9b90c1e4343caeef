// files.*: write/read/list/exists/makeDir/rename/remove, large files, watchDir, errors.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { createHash, randomBytes } from 'node:crypto'
import { FileNotFoundError, FilesystemEventType } from 'e2b'
import { withSandbox, waitFor } from './lib.mjs'

test('files write/read/list/exists/makeDir/rename/remove/getInfo', async () => {
  await withSandbox(async (sbx) => {
    const w = await sbx.files.write('/tmp/dir/a.txt', 'hello')
    assert.equal(w.path, '/tmp/dir/a.txt')
    assert.equal(await sbx.files.read('/tmp/dir/a.txt'), 'hello')
    const bytes = await sbx.files.read('/tmp/dir/a.txt', { format: 'bytes' })
    assert.deepEqual(Buffer.from(bytes), Buffer.from('hello'))

    // Relative paths are under the user's home.
    await sbx.files.write('rel.txt', 'r')
    assert.equal(await sbx.files.read('/home/user/rel.txt'), 'r')

    // Several files at once (multipart, one part per file).
    const many = await sbx.files.write([
      { path: '/tmp/dir/b.txt', data: 'b' },
      { path: '/tmp/dir/sub/c.txt', data: 'c' },
    ])
    assert.deepEqual(many.map((x) => x.path).sort(), ['/tmp/dir/b.txt', '/tmp/dir/sub/c.txt'])

    const list = await sbx.files.list('/tmp/dir')
    assert.deepEqual(list.map((e) => e.name).sort(), ['a.txt', 'b.txt', 'sub'])
    const sub = list.find((e) => e.name === 'sub')
    assert.equal(sub.type, 'dir')
    const a = list.find((e) => e.name === 'a.txt')
    assert.equal(a.type, 'file')
    assert.equal(a.size, 5)
    const deep = await sbx.files.list('/tmp/dir', { depth: 2 })
    assert.ok(deep.some((e) => e.path === '/tmp/dir/sub/c.txt'))

    assert.equal(await sbx.files.exists('/tmp/dir/a.txt'), true)
    assert.equal(await sbx.files.exists('/tmp/dir/nope'), false)
    const info = await sbx.files.getInfo('/tmp/dir/a.txt')
    assert.equal(info.name, 'a.txt')
    assert.equal(info.permissions, '-rw-r--r--')

    assert.equal(await sbx.files.makeDir('/tmp/newdir/x'), true)
    assert.equal(await sbx.files.makeDir('/tmp/newdir/x'), false)

    const moved = await sbx.files.rename('/tmp/dir/a.txt', '/tmp/newdir/a2.txt')
    assert.equal(moved.path, '/tmp/newdir/a2.txt')
    assert.equal(await sbx.files.exists('/tmp/dir/a.txt'), false)
    assert.equal(await sbx.files.read('/tmp/newdir/a2.txt'), 'hello')

    await sbx.files.remove('/tmp/newdir')
    assert.equal(await sbx.files.exists('/tmp/newdir'), false)

    // { user } owns what a write or makeDir makes (default: user).
    await sbx.files.write('/tmp/owned/root.txt', 'r', { user: 'root' })
    assert.equal(await sbx.files.makeDir('/tmp/owned/rootdir', { user: 'root' }), true)
    await sbx.files.write('/tmp/owned/user.txt', 'u')
    assert.equal((await sbx.files.getInfo('/tmp/owned/root.txt')).owner, 'root')
    assert.equal((await sbx.files.getInfo('/tmp/owned/rootdir')).owner, 'root')
    assert.equal((await sbx.files.getInfo('/tmp/owned/user.txt')).owner, 'user')

    // The shell sees what the files API wrote, and the other way round.
    await sbx.commands.run('echo -n from-shell > /tmp/shell.txt')
    assert.equal(await sbx.files.read('/tmp/shell.txt'), 'from-shell')
  })
})

test('FileNotFoundError for missing files', async () => {
  await withSandbox(async (sbx) => {
    await assert.rejects(sbx.files.read('/tmp/does-not-exist'), FileNotFoundError)
    await assert.rejects(sbx.files.list('/tmp/does-not-exist'), FileNotFoundError)
    await assert.rejects(sbx.files.rename('/tmp/does-not-exist', '/tmp/x'), FileNotFoundError)
  })
})

test('50 MB round trip', { timeout: 300000 }, async () => {
  await withSandbox(async (sbx) => {
    const data = randomBytes(50 * 1024 * 1024)
    const want = createHash('sha256').update(data).digest('hex')
    await sbx.files.write('/tmp/big.bin', data.buffer.slice(data.byteOffset, data.byteOffset + data.byteLength))
    const r = await sbx.commands.run('sha256sum /tmp/big.bin | cut -d" " -f1; stat -c %s /tmp/big.bin')
    assert.equal(r.stdout, `${want}\n${data.length}\n`)
    const back = await sbx.files.read('/tmp/big.bin', { format: 'bytes' })
    assert.equal(back.length, data.length)
    assert.equal(createHash('sha256').update(back).digest('hex'), want)
  })
})

test('octet-stream and gzip uploads (ReadableStream, gzip:true)', async () => {
  await withSandbox(async (sbx) => {
    await sbx.files.write('/tmp/gz.txt', 'compressed body', { gzip: true })
    assert.equal(await sbx.files.read('/tmp/gz.txt'), 'compressed body')
    const stream = new Blob(['streamed ', 'body']).stream()
    await sbx.files.write('/tmp/stream.txt', stream)
    assert.equal(await sbx.files.read('/tmp/stream.txt'), 'streamed body')
  })
})

test('watchDir reports create, write and remove', async () => {
  await withSandbox(async (sbx) => {
    await sbx.files.makeDir('/tmp/w')
    const events = []
    const handle = await sbx.files.watchDir('/tmp/w', (e) => { events.push(e) }, { recursive: true })
    await sbx.files.write('/tmp/w/x.txt', '1')
    await sbx.commands.run('mkdir -p /tmp/w/sub && echo 2 > /tmp/w/sub/y.txt && rm /tmp/w/x.txt')
    await waitFor(() => events.some((e) => e.name === 'x.txt' && e.type === FilesystemEventType.CREATE), 20000, 'create x.txt')
    await waitFor(() => events.some((e) => e.name === 'sub/y.txt'), 20000, 'event in sub/ (recursive)')
    await waitFor(() => events.some((e) => e.name === 'x.txt' && e.type === FilesystemEventType.REMOVE), 20000, 'remove x.txt')
    await handle.stop()
  })
})
