// @e2b/code-interpreter@2.8.0 on code-interpreter-v1 (space's python-data):
// cells run as E2B's IPython kernel runs them (issue 32 items 13, 14, 16).
// Run by e2e/e2b_ipython_test.go (node --test ipython.mjs).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from '@e2b/code-interpreter'
import { withSandbox } from './lib.mjs'

const ci = { cls: Sandbox }
const ok = (r) => assert.equal(r.error, undefined, r.error && `${r.error.name}: ${r.error.value}\n${r.error.traceback}`)

test('IPython input: indented cells, !shell, %cd and %pip magics, the last expression', { timeout: 180000 }, async () => {
  await withSandbox(async (sbx) => {
    // A template literal's indentation, as programs write cells.
    const r1 = await sbx.runCode(`
      def f(n):
          return n * 2
      f(21)
    `)
    ok(r1)
    assert.equal(r1.text, '42')

    const r2 = await sbx.runCode('!pwd')
    ok(r2)
    assert.equal(r2.logs.stdout.join('').trim(), '/home/user')

    const r3 = await sbx.runCode('%cd /tmp\nimport os\nos.getcwd()')
    ok(r3)
    assert.equal(r3.text, '/tmp')

    const r4 = await sbx.runCode('%pip --version')
    ok(r4)
    assert.match(r4.logs.stdout.join(''), /^pip \d+/)

    // A trailing semicolon hides the result, as in IPython.
    const r5 = await sbx.runCode('41 + 1;')
    ok(r5)
    assert.equal(r5.results.length, 0)
  }, ci)
})

test('rich results: str without quotes, DataFrame data and html, display(), PIL images, matplotlib PNG', { timeout: 180000 }, async () => {
  await withSandbox(async (sbx) => {
    const s = await sbx.runCode("x = 'bar'\nx")
    ok(s)
    assert.equal(s.text, 'bar')
    assert.equal((await sbx.runCode('"it\'s"')).text, '"it\'s"') // repr kept when it is not in single quotes

    const df = await sbx.runCode("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', None]})")
    ok(df)
    const main = df.results.find((r) => r.isMainResult)
    assert.deepEqual(main.data, { a: [1, 2], b: ['x', null] })
    assert.match(main.html, /<table/)

    const shown = await sbx.runCode("display(pd.DataFrame({'c': [3.5]}))\nprint('after')")
    ok(shown)
    assert.equal(shown.results.length, 1)
    assert.equal(shown.results[0].isMainResult, false)
    assert.deepEqual(shown.results[0].data, { c: [3.5] })
    assert.deepEqual(shown.logs.stdout, ['after\n'])

    const isPNG = (b64) => Buffer.from(b64, 'base64').subarray(1, 4).toString() === 'PNG'
    const pil = await sbx.runCode("from PIL import Image\nimg = Image.new('RGB', (8, 8), 'red')\nimg.show()\nimg")
    ok(pil)
    assert.equal(pil.results.length, 2, JSON.stringify(pil.results.map((r) => Object.keys(r))))
    assert.ok(pil.results.every((r) => r.png && isPNG(r.png)))
    assert.equal(pil.results[1].isMainResult, true)

    const fig = await sbx.runCode('import matplotlib.pyplot as plt\nplt.bar(["a", "b"], [1, 2])\nplt.title("bars")\nplt.show()')
    ok(fig)
    const png = fig.results.find((r) => r.png)
    assert.ok(png && isPNG(png.png), JSON.stringify(fig.results.map((r) => Object.keys(r))))
  }, ci)
})

test('charts: line, scatter, bar, pie and a superchart in result.chart', { timeout: 180000 }, async () => {
  await withSandbox(async (sbx) => {
    const chartOf = async (code) => {
      const r = await sbx.runCode('import matplotlib.pyplot as plt\n' + code + '\nplt.show()')
      ok(r)
      const c = r.results.find((x) => x.chart)
      assert.ok(c && c.png, JSON.stringify(r.results.map((x) => Object.keys(x))))
      return c.chart
    }
    const line = await chartOf('plt.plot([1, 2, 3], [1, 4, 9], label="sq")\nplt.title("squares")\nplt.xlabel("time (s)")\nplt.ylabel("y")')
    assert.equal(line.type, 'line')
    assert.equal(line.title, 'squares')
    assert.equal(line.x_label, 'time (s)')
    assert.equal(line.x_unit, 's')
    assert.equal(line.x_scale, 'linear')
    assert.deepEqual(line.elements, [{ label: 'sq', points: [[1, 1], [2, 4], [3, 9]] }])

    const sc = await chartOf('plt.scatter([1, 2], [3, 4], label="pts")')
    assert.equal(sc.type, 'scatter')
    assert.deepEqual(sc.elements, [{ label: 'pts', points: [[1, 3], [2, 4]] }])

    const bar = await chartOf('plt.bar(["a", "b"], [5, 7])\nplt.title("bars")')
    assert.equal(bar.type, 'bar')
    assert.equal(bar.title, 'bars')
    assert.deepEqual(bar.elements.map((e) => [e.label, e.value]), [['a', 5], ['b', 7]])

    const pie = await chartOf('plt.pie([1, 3], labels=["x", "y"])')
    assert.equal(pie.type, 'pie')
    assert.deepEqual(pie.elements.map((e) => [e.label, Math.round(e.angle)]), [['x', 90], ['y', 270]])

    const sup = await chartOf('fig, (a, b) = plt.subplots(1, 2)\na.plot([0, 1], [0, 1])\nb.bar(["k"], [2])\nfig.suptitle("two")')
    assert.equal(sup.type, 'superchart')
    assert.equal(sup.title, 'two')
    assert.deepEqual(sup.elements.map((e) => e.type), ['line', 'bar'])
  }, ci)
})

test('contexts: the defaults are listed on a fresh sandbox; cwd /root works (kernels run as root)', { timeout: 180000 }, async () => {
  await withSandbox(async (sbx) => {
    const fresh = await sbx.listCodeContexts()
    const byLang = Object.fromEntries(fresh.map((c) => [c.language, c]))
    assert.ok(byLang.python && byLang.javascript, JSON.stringify(fresh))
    assert.equal(byLang.python.cwd, '/home/user')

    const root = await sbx.createCodeContext({ language: 'python', cwd: '/root' })
    const r = await sbx.runCode('import os\n(os.getcwd(), os.geteuid())', { context: root })
    ok(r)
    assert.equal(r.text, "('/root', 0)")
    const js = await sbx.createCodeContext({ language: 'js', cwd: '/root' })
    const j = await sbx.runCode('process.cwd()', { context: js })
    ok(j)
    assert.equal(j.text, '/root')
    // The default context runs as root too, in /home/user.
    assert.equal((await sbx.runCode('import os\nos.geteuid()')).text, '0')
  }, ci)
})
