package gvisor_test

import (
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/spacesandbox/space/internal/driver"
	"github.com/spacesandbox/space/internal/driver/drivertest"
	"github.com/spacesandbox/space/internal/driver/gvisor"
	"github.com/spacesandbox/space/internal/testenv"
)

func TestConformance(t *testing.T) {
	runsc := testenv.Runsc(t)
	agent := testenv.Agent(t)
	tpl := testenv.Base(t)
	root := t.TempDir()
	drivertest.Run(t, drivertest.Setup{
		New: func(t *testing.T) driver.Driver {
			d, err := gvisor.New(t.Context(), gvisor.Config{Runsc: runsc, Root: filepath.Join(root, "runsc"), Log: slog.Default()})
			if err != nil {
				t.Fatal(err)
			}
			return d
		},
		Spec: func(t *testing.T) driver.Spec {
			b := make([]byte, 6)
			rand.Read(b)
			id := "sb-test" + hex.EncodeToString(b)
			return driver.Spec{
				ID: id, Hostname: "sandbox", Rootfs: tpl.Path, RootfsKind: "dir",
				StateDir: filepath.Join(root, "sandboxes", id), AgentPath: agent,
				VCPU: 1, MemoryMB: 256,
			}
		},
	})
}

// The pinned version in Go and in the Makefile must agree: the Makefile
// builds what the server looks for.
func TestPinnedVersionMatchesMakefile(t *testing.T) {
	mk, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^RUNSC_VERSION\s*:?=\s*(\S+)`).FindSubmatch(mk)
	if m == nil || string(m[1]) != gvisor.PinnedVersion {
		t.Fatalf("Makefile RUNSC_VERSION = %q, gvisor.PinnedVersion = %q", m, gvisor.PinnedVersion)
	}
}
