package cli

import (
	"bytes"
	"io"
	"strings"
	"testing"
)

// TestServePoolDriversInvalid: a bad --pool-drivers (flag or variable)
// stops `space serve` before anything starts, with an error naming the
// flag and the expected form.
func TestServePoolDriversInvalid(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
	}{
		{args: []string{"serve", "--data", t.TempDir(), "--pool-drivers", "qemu=x"}},
		{args: []string{"serve", "--data", t.TempDir()}, env: map[string]string{"SPACE_POOL_DRIVERS": "kvm=2"}},
		{args: []string{"serve", "--data", t.TempDir(), "--pool-drivers", "qemu=1,qemu=2"}},
	} {
		var stderr bytes.Buffer
		code := run(t.Context(), tc.args, nil, io.Discard, &stderr, func(k string) string { return tc.env[k] })
		if code == 0 || !strings.Contains(stderr.String(), "--pool-drivers") || !strings.Contains(stderr.String(), "DRIVER=N") {
			t.Errorf("%v %v: exit %d, stderr %q", tc.args, tc.env, code, stderr.String())
		}
	}
	if (&app{}).serveCommand().Flags().Lookup("pool-drivers") == nil {
		t.Error("serve has no --pool-drivers")
	}
}
