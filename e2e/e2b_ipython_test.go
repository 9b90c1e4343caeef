package e2e

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"
)

// TestE2BInterpreterIPython runs e2b/ipython.mjs with the unmodified
// @e2b/code-interpreter SDK against real python-data sandboxes: cells go
// through IPython (dedent, !shell, %magics), results are E2B's (str text
// without quotes, DataFrame data, PIL and matplotlib PNGs), the default
// contexts are listed on a fresh sandbox and kernels run as root.
func TestE2BInterpreterIPython(t *testing.T) {
	node, dir, s, addr := e2bServer(t)
	key := s.teamKey("e2b-ipython")
	url := "http://" + addr
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "--test", "--test-reporter=spec", "ipython.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "E2B_API_KEY="+key, "E2B_API_URL="+url, "E2B_SANDBOX_URL="+url, "NO_COLOR=1", "E2B_DEBUG=")
	out, err := cmd.CombinedOutput()
	t.Logf("node --test ipython.mjs:\n%s", out)
	if err != nil {
		t.Fatalf("ipython.mjs failed: %v", err)
	}
}
