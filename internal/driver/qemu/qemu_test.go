package qemu_test

import (
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/spacesandbox/space/internal/driver"
	"github.com/spacesandbox/space/internal/driver/drivertest"
	"github.com/spacesandbox/space/internal/driver/qemu"
	"github.com/spacesandbox/space/internal/testenv"
)

func TestConformance(t *testing.T) {
	testenv.QEMU(t)
	agent := testenv.Agent(t)
	img := testenv.BaseImage(t)
	root := t.TempDir()
	drivertest.Run(t, drivertest.Setup{
		New: func(t *testing.T) driver.Driver {
			d, err := qemu.New(t.Context(), qemu.Config{CacheDir: testenv.VMCacheDir(), Log: slog.Default()})
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
				ID: id, Hostname: "sandbox", Rootfs: img, RootfsKind: "raw",
				StateDir: filepath.Join(root, "sandboxes", id), AgentPath: agent,
				VCPU: 1, MemoryMB: 256,
			}
		},
	})
}
