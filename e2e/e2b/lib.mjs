// Shared helpers of the E2B SDK suite. The SDK reads E2B_API_KEY,
// E2B_API_URL and E2B_SANDBOX_URL from the environment (set by
// e2e/e2b_test.go to a real `space serve --e2b-listen`).
import { Sandbox } from 'e2b'

export const runId = process.env.E2B_RUN_ID || String(Date.now())

// withSandbox creates a sandbox, runs fn and always kills it.
export async function withSandbox(fn, { cls = Sandbox, template, opts = {} } = {}) {
  const sbx = template ? await cls.create(template, opts) : await cls.create(opts)
  try {
    return await fn(sbx)
  } finally {
    await sbx.kill().catch(() => {})
  }
}

// waitFor polls cond until it is truthy or ms pass.
export async function waitFor(cond, ms = 20000, what = 'condition') {
  const end = Date.now() + ms
  for (;;) {
    const v = await cond()
    if (v) return v
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 50))
  }
}
