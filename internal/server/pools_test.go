package server

import (
	"bytes"
	"errors"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/e2b"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/httpapi"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

// A stored setting replaces the command line's pool of its template and
// driver; one whose driver is not enabled or whose template is not built
// in is ignored (and said); python-data pools prestart the code
// interpreter's kernel only with the E2B API on; QEMU pools refill from
// an image.
func TestPoolManagerMerge(t *testing.T) {
	ctx := t.Context()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "space.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, p := range []store.PoolSetting{
		{Template: "base", Driver: "gvisor", Size: 5, Max: 9, MemoryMB: 1024, CPU: 2},
		{Template: "python-data", Driver: "gvisor", Size: 0},
		{Template: "base", Driver: "firecracker", Size: 1, Max: 4},
		{Template: "gone", Driver: "gvisor", Size: 1, Max: 4},
	} {
		p.UpdatedAt = time.Now()
		if err := st.PutPoolSetting(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	flags := []sandbox.PoolConfig{
		{Template: "base", Driver: "gvisor", Size: 2},
		{Template: "python-data", Driver: "gvisor", Size: 1},
		{Template: "base", Driver: "qemu", Size: 1, MemoryMB: 256},
	}
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	for _, e2bOn := range []bool{false, true} {
		m, err := newPoolManager(ctx, nil, st, log, map[string]bool{"gvisor": true, "qemu": true}, "gvisor", e2bOn, flags)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.config(poolKey{"base", "gvisor"}); got.Size != 5 || got.Max != 9 || got.MemoryMB != 1024 || got.CPU != 2 || got.Source != "api" || got.FromImage || got.Prestart != nil {
			t.Errorf("base on gvisor: %+v, want the stored setting", got)
		}
		if got := m.config(poolKey{"python-data", "gvisor"}); got.Size != 0 || got.Source != "api" {
			t.Errorf("python-data on gvisor: %+v, want turned off by its setting", got)
		}
		if got := m.config(poolKey{"base", "qemu"}); got.Size != 1 || got.MemoryMB != 256 || got.Source != "flags" || !got.FromImage {
			t.Errorf("base on qemu: %+v, want the command line's, refilled from an image", got)
		}
		if got := m.config(poolKey{"base", "firecracker"}); got.Size != 0 || got.Source != "" {
			t.Errorf("base on firecracker (not enabled): %+v, want no pool", got)
		}
		if got := m.templates(); !slices.Equal(got, []string{"base"}) {
			t.Errorf("templates with a pool: %v, want base only", got)
		}
		// A setting made now on python-data: prestarted with E2B only.
		m.set[poolKey{"python-data", "gvisor"}] = store.PoolSetting{Template: "python-data", Driver: "gvisor", Size: 1, Max: 4}
		if got := m.config(poolKey{"python-data", "gvisor"}); (got.Prestart != nil) != e2bOn {
			t.Errorf("python-data with E2B %v: prestart %+v", e2bOn, got.Prestart)
		}
		if e2bOn && !slices.Equal(m.config(poolKey{"python-data", "gvisor"}).Prestart.Start.Cmd, e2b.KernelPrestart().Start.Cmd) {
			t.Errorf("python-data's prestart is not the code interpreter's kernel")
		}
		// One that turns the prestart off.
		m.set[poolKey{"python-data", "gvisor"}] = store.PoolSetting{Template: "python-data", Driver: "gvisor", Size: 1, Max: 4, NoPrestart: true}
		if got := m.config(poolKey{"python-data", "gvisor"}); got.Prestart != nil || got.Size != 1 {
			t.Errorf("python-data with the prestart off (E2B %v): %+v", e2bOn, got)
		}
	}
	// A setting of a driver not enabled can still be deleted; an unknown
	// driver is refused.
	m, err := newPoolManager(ctx, nil, st, log, map[string]bool{"gvisor": true}, "gvisor", false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := m.ResetPool(ctx, "base", "firecracker"); err != nil || v.State != "off" || v.Source != "none" {
		t.Errorf("reset of a setting of a driver not enabled: %+v, %v", v, err)
	}
	if _, err := m.ResetPool(ctx, "base", "firecracker"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second reset: %v, want not found", err)
	}
	if _, err := m.ResetPool(ctx, "base", "kvm"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("reset on an unknown driver: %v, want invalid argument", err)
	}
	if _, err := m.SetPool(ctx, httpapi.PoolSetting{Template: "base", Driver: "firecracker", Size: 1}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("set on a driver not enabled: %v, want invalid argument", err)
	}
	if ps, _ := st.PoolSettings(ctx); len(ps) != 3 {
		t.Errorf("settings after the reset: %+v, want the other three", ps)
	}
	for _, want := range []string{
		`msg="warm pool setting ignored: its driver is not among --drivers" template=base driver=firecracker`,
		`msg="warm pool setting ignored: no such template" template=gone driver=gvisor`,
	} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
}
