package firecracker

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// fakeModules makes a modules directory with the virtio modules vmimage
// loads and the vsock ones this driver adds (dummy .ko files).
func fakeModules(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	dep := strings.Join([]string{
		"kernel/drivers/virtio/virtio.ko:",
		"kernel/drivers/virtio/virtio_ring.ko:",
		"kernel/drivers/virtio/virtio_mmio.ko: kernel/drivers/virtio/virtio_ring.ko kernel/drivers/virtio/virtio.ko",
		"kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio_ring.ko kernel/drivers/virtio/virtio.ko",
		"kernel/drivers/char/virtio_console.ko: kernel/drivers/virtio/virtio_ring.ko kernel/drivers/virtio/virtio.ko",
		"kernel/net/vmw_vsock/vsock.ko:",
		"kernel/net/vmw_vsock/vmw_vsock_virtio_transport_common.ko: kernel/net/vmw_vsock/vsock.ko",
		"kernel/net/vmw_vsock/vmw_vsock_virtio_transport.ko: kernel/net/vmw_vsock/vmw_vsock_virtio_transport_common.ko kernel/net/vmw_vsock/vsock.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko",
		"kernel/net/vmw_vsock/vsock_loopback.ko: kernel/net/vmw_vsock/vmw_vsock_virtio_transport_common.ko kernel/net/vmw_vsock/vsock.ko",
	}, "\n") + "\n"
	if err := os.WriteFile(filepath.Join(dir, "modules.dep"), []byte(dep), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(dep), "\n") {
		mod, _, _ := strings.Cut(line, ":")
		p := filepath.Join(dir, mod)
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte("module "+filepath.Base(mod)), 0o644)
	}
	os.WriteFile(filepath.Join(dir, "modules.builtin"), []byte("kernel/fs/ext4/ext4.ko\n"), 0o644)
	return dir
}

// cpioEntry is one file of a newc archive.
type cpioEntry struct {
	name string
	data []byte
}

// readCpio parses concatenated newc archives as the kernel does: zero
// padding between them is skipped.
func readCpio(t *testing.T, b []byte) (archives [][]cpioEntry) {
	t.Helper()
	var cur []cpioEntry
	off := 0
	hex := func(field int) int {
		v, err := strconv.ParseUint(string(b[off+6+8*field:off+14+8*field]), 16, 32)
		if err != nil {
			t.Fatalf("bad header at %d: %v", off, err)
		}
		return int(v)
	}
	align := func(n int) int { return (n + 3) &^ 3 }
	for off < len(b) {
		if b[off] == 0 {
			off++
			continue
		}
		if off%4 != 0 || string(b[off:off+6]) != "070701" {
			t.Fatalf("no newc header at %d", off)
		}
		size, namesize := hex(6), hex(11)
		name := string(b[off+110 : off+110+namesize-1])
		data := off + align(110+namesize)
		off = data + align(size)
		if name == "TRAILER!!!" {
			archives = append(archives, cur)
			cur = nil
			continue
		}
		cur = append(cur, cpioEntry{name, b[data : data+size]})
	}
	if cur != nil {
		t.Fatalf("archive without trailer")
	}
	return archives
}

// TestInitramfs: vmimage's archive followed by one with the vsock modules
// it lacks (not the virtio core again), named to load after vmimage's, and
// cached.
func TestInitramfs(t *testing.T) {
	modules := fakeModules(t)
	agent := filepath.Join(t.TempDir(), "space-agent")
	os.WriteFile(agent, []byte("#!agent"), 0o755)
	d := newDriver(Config{CacheDir: t.TempDir()}, fakeVersion, "", modules)
	path, err := d.initramfs(t.Context(), agent)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm()&0o004 == 0 {
		t.Errorf("initramfs mode %v: the jailed uid must read it", fi.Mode())
	}
	archives := readCpio(t, b)
	if len(archives) != 2 {
		t.Fatalf("%d archives, want vmimage's and ours", len(archives))
	}
	var baseMods []string
	for _, e := range archives[0] {
		if strings.HasPrefix(e.name, "lib/modules/") {
			baseMods = append(baseMods, e.name)
		}
	}
	var extra []string
	for _, e := range archives[1] {
		extra = append(extra, e.name)
		if want := "module " + strings.SplitN(filepath.Base(e.name), "-", 2)[1]; string(e.data) != want {
			t.Errorf("%s holds %q, want %q", e.name, e.data, want)
		}
	}
	want := []string{
		"lib/modules/z00-vsock.ko",
		"lib/modules/z01-vmw_vsock_virtio_transport_common.ko",
		"lib/modules/z02-vmw_vsock_virtio_transport.ko",
	}
	if !slices.Equal(extra, want) {
		t.Errorf("appended modules %q, want %q", extra, want)
	}
	// The agent loads /lib/modules/*.ko in name order: ours after vmimage's.
	all := append(slices.Clone(baseMods), extra...)
	if !slices.IsSorted(all) || len(baseMods) == 0 {
		t.Errorf("load order %q", all)
	}
	again, err := d.initramfs(t.Context(), agent)
	if err != nil || again != path {
		t.Errorf("second build %s, %v; want the cached %s", again, err, path)
	}
	// Another agent binary is another initramfs.
	os.WriteFile(agent, []byte("#!agent v2"), 0o755)
	if other, err := d.initramfs(t.Context(), agent); err != nil || other == path {
		t.Errorf("new agent: %s, %v", other, err)
	}
}

func TestExtraModulesBuiltin(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "modules.dep"), []byte("kernel/drivers/virtio/virtio_mmio.ko:\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "modules.builtin"), []byte("kernel/net/vmw_vsock/vmw_vsock_virtio_transport.ko\n"), 0o644)
	if mods, err := extraModules(dir, vsockModules, []string{"virtio_mmio"}); err != nil || len(mods) != 0 {
		t.Errorf("built-in vsock: %q, %v", mods, err)
	}
	os.WriteFile(filepath.Join(dir, "modules.builtin"), nil, 0o644)
	if _, err := extraModules(dir, vsockModules, nil); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("missing vsock module: %v", err)
	}
}
