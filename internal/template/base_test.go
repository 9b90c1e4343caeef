package template_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spacesandbox/space/internal/testenv"
)

// The built base template, as sandboxes get it (the shared cache's build,
// made here if missing): names resolve without a network, the hostname
// every driver sets included, and nothing of the build host's or the
// build's configuration is left.
func TestBaseNetworkFiles(t *testing.T) {
	tpl := testenv.Base(t)
	etc := filepath.Join(tpl.Path, "etc")
	want := map[string]string{
		"hosts":    "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.0.1\tsandbox\n",
		"hostname": "sandbox\n",
	}
	for name, content := range want {
		if b, err := os.ReadFile(filepath.Join(etc, name)); err != nil || string(b) != content {
			t.Errorf("/etc/%s = %q, %v; want %q", name, b, err, content)
		}
	}
	for _, name := range []string{"hosts", "hostname", "resolv.conf"} {
		if st, err := os.Lstat(filepath.Join(etc, name)); err != nil {
			t.Errorf("/etc/%s: %v", name, err)
		} else if st.Mode() != 0o644 {
			t.Errorf("/etc/%s: mode %v, want a 0644 file", name, st.Mode())
		}
	}
	if b, err := os.ReadFile(filepath.Join(etc, "resolv.conf")); err != nil || strings.Contains(string(b), "nameserver") {
		t.Errorf("/etc/resolv.conf = %q, %v; want no nameserver", b, err)
	}
	if _, err := os.Lstat(filepath.Join(etc, "dpkg", "dpkg.cfg.d", "99mmdebstrap")); !os.IsNotExist(err) {
		t.Errorf("the build's dpkg options are left in the image: %v", err)
	}
	// A sandbox has loopback only: its own network namespace here.
	for _, argv := range [][]string{
		{"getent", "hosts", "localhost"},
		{"getent", "hosts", "sandbox"},
		{"python3", "-c", "import socket; print(socket.getaddrinfo('localhost', 80)[0][4][0])"},
	} {
		out, err := exec.Command("unshare", append([]string{"--net", "chroot", tpl.Path}, argv...)...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "127.0.0.1") && !strings.Contains(string(out), "::1") {
			t.Errorf("%s in the base rootfs: %v: %s", strings.Join(argv, " "), err, out)
		}
	}
}
