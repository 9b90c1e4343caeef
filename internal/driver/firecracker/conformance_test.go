package firecracker

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/spacesandbox/space/internal/driver"
	"github.com/spacesandbox/space/internal/driver/drivertest"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/testenv"
)

// realFirecracker returns the configuration of the real firecracker and
// jailer on this host ($SPACE_FIRECRACKER / $SPACE_JAILER, else PATH), or
// why they cannot run here.
func realFirecracker() (Config, string) {
	var cfg Config
	for _, b := range []struct {
		path      *string
		env, name string
	}{{&cfg.Firecracker, "SPACE_FIRECRACKER", "firecracker"}, {&cfg.Jailer, "SPACE_JAILER", "jailer"}} {
		*b.path = os.Getenv(b.env)
		if *b.path == "" {
			p, err := exec.LookPath(b.name)
			if err != nil {
				return cfg, "no " + b.name + " binary: set $" + b.env + " or put " + b.name + " on PATH (a Firecracker release)"
			}
			*b.path = p
		}
	}
	if err := kvmDevice("/dev/kvm"); err != nil {
		return cfg, "Firecracker needs a usable /dev/kvm: " + err.Error()
	}
	if os.Geteuid() != 0 {
		return cfg, "the jailer needs root"
	}
	return cfg, ""
}

// TestConformance runs the driver conformance suite on real Firecracker
// microVMs wherever firecracker, its jailer and a working KVM exist;
// elsewhere it says what is missing and skips. The guest kernel, agent and
// base image come from testenv as for the qemu driver.
func TestConformance(t *testing.T) {
	cfg, why := realFirecracker()
	if why != "" {
		t.Skip(why)
	}
	testenv.QEMU(t) // the guest kernel package and mkfs.ext4 (qemu-img for the image tools)
	agent := testenv.Agent(t)
	img := testenv.BaseImage(t)
	cfg.CacheDir = testenv.VMCacheDir()
	cfg.Log = slog.Default()
	// The boot probe is the last word on KVM (a nested PVM /dev/kvm opens
	// but does not boot a stock kernel).
	if _, err := New(t.Context(), cfg); errors.Is(err, errdefs.ErrUnavailable) {
		t.Skipf("firecracker cannot run guests here: %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	drivertest.Run(t, drivertest.Setup{
		New: func(t *testing.T) driver.Driver {
			d, err := New(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			return d
		},
		Spec: func(t *testing.T) driver.Spec {
			b := make([]byte, 6)
			rand.Read(b)
			id := "sb-fc" + hex.EncodeToString(b)
			return driver.Spec{
				ID: id, Hostname: "sandbox", Rootfs: img, RootfsKind: "raw",
				StateDir: filepath.Join(root, "sandboxes", id), AgentPath: agent,
				VCPU: 1, MemoryMB: 256,
			}
		},
	})
}
