// space's JavaScript kernel for the E2B code interpreter (internal/e2b):
// one Node process per code context; every execution runs in the same vm
// context, so globals (and top-level let/const) persist. Reads one JSON
// request per line ({"id", "code", "env"}); writes "\x1e" + JSON + "\n"
// messages, the request's id in its number_of_executions (the host tells
// this execution's output from an earlier one's by it).
// A line {"init": {"env": {...}}} is not an execution: the agent writes it
// when the sandbox's identity changes (this kernel's copy in a fork's child
// or in a sandbox made from a checkpoint); its env becomes the kernel's.
'use strict'
const vm = require('vm')
const util = require('util')
const readline = require('readline')

const write = process.stdout.write.bind(process.stdout)
const emit = (msg) => write('\x1e' + JSON.stringify(msg) + '\n')
const text = (args) => util.formatWithOptions({ colors: false }, ...args) + '\n'
const out = (...a) => emit({ type: 'stdout', text: text(a) })
const err = (...a) => emit({ type: 'stderr', text: text(a) })
const sandboxConsole = { log: out, info: out, debug: out, dir: (o) => out(util.inspect(o)), error: err, warn: err, trace: err }

const ctx = vm.createContext({
  console: sandboxConsole, require, process, Buffer, URL, URLSearchParams, TextEncoder, TextDecoder,
  setTimeout, clearTimeout, setInterval, clearInterval, setImmediate, clearImmediate, queueMicrotask,
  fetch: globalThis.fetch, structuredClone,
})

let count = 0
let chain = Promise.resolve()

async function run(req) {
  count++
  const start = { type: 'number_of_executions', execution_count: count }
  if (typeof req.id === 'string') start.id = req.id
  emit(start)
  // Only the keys the request's env sets are put back after the cell
  // (undefined: unset): what the cell itself does to process.env stays,
  // as in a Jupyter kernel.
  const saved = new Map()
  try {
    for (const [k, v] of Object.entries(req.env || {})) {
      if (!saved.has(k)) saved.set(k, Object.prototype.hasOwnProperty.call(process.env, k) ? process.env[k] : undefined)
      process.env[k] = v
    }
    // SIGINT (sent by the host when the client stopped waiting) breaks a
    // running script; outside one it is ignored (below).
    let v = vm.runInContext(req.code || '', ctx, { filename: '<cell>', breakOnSigint: true })
    if (v && typeof v.then === 'function') v = await v
    if (v !== undefined) emit({ type: 'result', text: typeof v === 'string' ? v : util.inspect(v), extra: {}, is_main_result: true })
  } catch (e) {
    const name = (e && e.name) || 'Error'
    const value = e && e.message !== undefined ? e.message : String(e)
    emit({ type: 'error', name, value, traceback: (e && e.stack) || String(e) })
  } finally {
    for (const [k, v] of saved) {
      try {
        if (v === undefined) delete process.env[k]
        else process.env[k] = v
      } catch {}
    }
    emit({ type: 'end_of_execution' })
  }
}

readline.createInterface({ input: process.stdin }).on('line', (line) => {
  let req
  try { req = JSON.parse(line) } catch { return }
  if (!req || typeof req !== 'object') return
  if ('init' in req) {
    // Between executions, like every request: a running cell's env is
    // restored when it ends, and the identity must outlive that.
    const env = (req.init && req.init.env) || {}
    chain = chain.then(() => { Object.assign(process.env, env) })
    return
  }
  chain = chain.then(() => run(req))
})
process.on('SIGINT', () => {})
process.on('uncaughtException', (e) => emit({ type: 'stderr', text: String((e && e.stack) || e) + '\n' }))
process.on('unhandledRejection', (e) => emit({ type: 'stderr', text: String((e && e.stack) || e) + '\n' }))
