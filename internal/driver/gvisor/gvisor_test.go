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

// Destroy leaves no cgroup behind: neither for a sandbox that ran nor for
// one whose start was cut short after runsc made its cgroups (simulated by
// making one by hand).
func TestDestroyRemovesCgroups(t *testing.T) {
	runsc := testenv.Runsc(t)
	agent := testenv.Agent(t)
	tpl := testenv.Base(t)
	root := t.TempDir()
	d, err := gvisor.New(t.Context(), gvisor.Config{Runsc: runsc, Root: filepath.Join(root, "runsc"), Log: slog.Default()})
	if err != nil {
		t.Fatal(err)
	}
	spec := func() driver.Spec {
		b := make([]byte, 6)
		rand.Read(b)
		id := "sb-test" + hex.EncodeToString(b)
		return driver.Spec{ID: id, Hostname: "sandbox", Rootfs: tpl.Path, RootfsKind: "dir",
			StateDir: filepath.Join(root, "sandboxes", id), AgentPath: agent, VCPU: 1, MemoryMB: 256}
	}
	cgroups := func(id string) []string {
		dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/*/space", id))
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/space", id)); err == nil {
			dirs = append(dirs, filepath.Join("/sys/fs/cgroup/space", id))
		}
		return dirs
	}
	ctx := t.Context()

	ran := spec()
	inst, err := d.Create(ctx, ran)
	if err != nil {
		t.Fatal(err)
	}
	if err := inst.Start(ctx); err != nil {
		inst.Destroy(ctx)
		t.Fatal(err)
	}
	if len(cgroups(ran.ID)) == 0 {
		t.Log("runsc made no cgroup under space/ on this host; checking removal only")
	}
	if err := inst.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if left := cgroups(ran.ID); len(left) > 0 {
		t.Errorf("cgroups left after Destroy: %v", left)
	}

	cut := spec()
	inst, err = d.Create(ctx, cut)
	if err != nil {
		t.Fatal(err)
	}
	made := filepath.Join("/sys/fs/cgroup/cpu/space", cut.ID)
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		made = filepath.Join("/sys/fs/cgroup/space", cut.ID)
	}
	if err := os.MkdirAll(made, 0o755); err != nil {
		inst.Destroy(ctx)
		t.Skipf("cannot make a cgroup here: %v", err)
	}
	if err := inst.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if left := cgroups(cut.ID); len(left) > 0 {
		os.Remove(made)
		t.Errorf("cgroups left after Destroy of an unstarted sandbox: %v", left)
	}
}
