package vmimage

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestDecodeLZ4Block(t *testing.T) {
	// "abcabcabcabcX": 3 literals, a match of 9 at offset 3, then "X".
	block := []byte{0x35, 'a', 'b', 'c', 3, 0, 0x10, 'X'}
	got, err := decodeLZ4Block(block, nil)
	if err != nil || string(got) != "abcabcabcabcX" {
		t.Fatalf("got %q, %v", got, err)
	}
	if _, err := decodeLZ4Block([]byte{0x05, 9, 0}, nil); err == nil {
		t.Fatal("match before the start of output accepted")
	}
}

// The legacy frame has no end marker: output short of the size the kernel
// build recorded (a truncated payload) is an error, not a kernel.
func TestDecodeLZ4Legacy(t *testing.T) {
	block := []byte{0x35, 'a', 'b', 'c', 3, 0, 0x10, 'X'} // "abcabcabcabcX"
	frame := binary.LittleEndian.AppendUint32(nil, 0x184c2102)
	frame = binary.LittleEndian.AppendUint32(frame, uint32(len(block)))
	frame = append(frame, block...)
	if got, err := decodeLZ4Legacy(frame, 13); err != nil || string(got) != "abcabcabcabcX" {
		t.Fatalf("got %q, %v", got, err)
	}
	if _, err := decodeLZ4Legacy(frame, 14); err == nil {
		t.Error("output shorter than the recorded size accepted")
	}
	if _, err := decodeLZ4Legacy(frame[:len(frame)-3], 13); err == nil {
		t.Error("truncated frame accepted")
	}
}

func TestCompareVersions(t *testing.T) {
	for _, tc := range []struct {
		older, newer string
	}{
		{"6.1.0-9-cloud-amd64", "6.1.0-10-cloud-amd64"},
		{"vmlinuz-6.1.0-9-cloud-amd64", "vmlinuz-6.1.0-10-cloud-amd64"},
		{"6.12.9+deb13-cloud-amd64", "6.12.38+deb13-cloud-amd64"},
		{"6.1.0-57-cloud-amd64", "6.12.9+deb13-cloud-amd64"},
		{"6.12~rc1-cloud-amd64", "6.12-cloud-amd64"},
		{"6.1.0-09", "6.1.0-10"},
		{"6.1.0-99999999999999999999", "6.1.0-100000000000000000000"},
	} {
		if c := compareVersions(tc.older, tc.newer); c >= 0 {
			t.Errorf("compareVersions(%s, %s) = %d, want < 0", tc.older, tc.newer, c)
		}
		if c := compareVersions(tc.newer, tc.older); c <= 0 {
			t.Errorf("compareVersions(%s, %s) = %d, want > 0", tc.newer, tc.older, c)
		}
	}
	for _, v := range []string{"", "6.1.0-10-cloud-amd64", "6.1.0-010"} {
		if c := compareVersions(v, strings.Replace(v, "010", "10", 1)); c != 0 {
			t.Errorf("compareVersions(%s, itself) = %d", v, c)
		}
	}
}

// TestKernel extracts the installed cloud kernel (the real thing VMs boot)
// and checks the modules the initramfs needs resolve with dependencies first.
func TestKernel(t *testing.T) {
	cache := t.TempDir()
	vmlinux, mods, err := Kernel(t.Context(), cache)
	if err != nil {
		t.Fatalf("%v (the qemu driver needs it: apt-get install -y %s)", err, KernelPackage)
	}
	elf, err := os.ReadFile(vmlinux)
	if err != nil || !bytes.HasPrefix(elf, []byte("\x7fELF")) || len(elf) < 10<<20 {
		t.Fatalf("vmlinux %s: %d bytes, %v", vmlinux, len(elf), err)
	}
	again, _, err := Kernel(t.Context(), cache)
	if err != nil || again != vmlinux {
		t.Fatalf("second Kernel: %s, %v", again, err)
	}
	// A cached kernel left empty by a power loss (before entries were
	// fsynced) is rebuilt, not served, and a crashed build's temp file
	// is removed.
	stale := vmlinux + ".tmp-999999"
	if err := os.WriteFile(stale, []byte("half"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(vmlinux, 0); err != nil {
		t.Fatal(err)
	}
	again, _, err = Kernel(t.Context(), cache)
	if b, rerr := os.ReadFile(again); err != nil || again != vmlinux || rerr != nil || !bytes.Equal(b, elf) {
		t.Fatalf("Kernel over an empty cache entry: %s, %v, %d bytes", again, err, len(b))
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("stale temp file left: %v", err)
	}
	closure, err := moduleClosure(mods, GuestModules)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range closure {
		names = append(names, modName(m))
	}
	got := strings.Join(names, " ")
	if !strings.HasPrefix(got, "virtio_ring virtio ") || !strings.Contains(got, "virtio_console") {
		t.Errorf("module order %q", got)
	}
}

func TestInitramfsCachedAndConcurrent(t *testing.T) {
	_, mods, err := Kernel(t.Context(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cache := t.TempDir()
	agent := filepath.Join(t.TempDir(), "agent")
	os.WriteFile(agent, []byte("#!/bin/true\n"), 0o755)
	var wg sync.WaitGroup
	paths := make([]string, 4)
	for i := range paths {
		wg.Go(func() {
			p, err := Initramfs(context.Background(), cache, mods, agent)
			if err != nil {
				t.Error(err)
			}
			paths[i] = p
		})
	}
	wg.Wait()
	for _, p := range paths[1:] {
		if p != paths[0] {
			t.Fatalf("paths differ: %v", paths)
		}
	}
	if _, err := exec.LookPath("cpio"); err == nil {
		out, err := exec.Command("sh", "-c", "cpio -t < "+paths[0]).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "init\n") || !strings.Contains(string(out), "virtio_console.ko") {
			t.Errorf("cpio -t: %v\n%s", err, out)
		}
	}
	leftovers, _ := filepath.Glob(filepath.Join(cache, "initramfs", "*.tmp-*"))
	if len(leftovers) > 0 {
		t.Errorf("temp files left: %v", leftovers)
	}
	// A cached archive cut short is rebuilt.
	good, err := os.ReadFile(paths[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(paths[0], int64(len(good)/2)); err != nil {
		t.Fatal(err)
	}
	if p, err := Initramfs(t.Context(), cache, mods, agent); err != nil || p != paths[0] {
		t.Fatalf("Initramfs over a truncated entry: %s, %v", p, err)
	}
	if b, err := os.ReadFile(paths[0]); err != nil || !bytes.Equal(b, good) {
		t.Fatalf("rebuilt initramfs differs: %d bytes, %v", len(b), err)
	}
}

func TestRootImage(t *testing.T) {
	if _, err := exec.LookPath("debugfs"); err != nil {
		t.Fatal("debugfs not found: apt-get install -y e2fsprogs")
	}
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "bin"), 0o755)
	os.WriteFile(filepath.Join(root, "bin", "hello"), []byte("hi there"), 0o755)
	cache := t.TempDir()
	img, err := RootImage(t.Context(), cache, root, "abcdef0123456789")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("debugfs", "-R", "cat /bin/hello", img).Output()
	if err != nil || string(out) != "hi there" {
		t.Fatalf("debugfs cat: %q, %v", out, err)
	}
	if !strings.HasSuffix(img, ".r1.ext4") {
		t.Errorf("root image %s: no format version in its name", img)
	}
	// A torn image (written before entries were fsynced) is rebuilt.
	if err := os.Truncate(img, 4096); err != nil {
		t.Fatal(err)
	}
	if again, err := RootImage(t.Context(), cache, root, "abcdef0123456789"); err != nil || again != img {
		t.Fatalf("RootImage over a torn entry: %s, %v", again, err)
	}
	out, err = exec.Command("debugfs", "-R", "cat /bin/hello", img).Output()
	if err != nil || string(out) != "hi there" {
		t.Fatalf("debugfs cat after the rebuild: %q, %v", out, err)
	}
	if _, err := RootImage(t.Context(), cache, root, "../bad"); err == nil {
		t.Error("bad digest accepted")
	}
}

// An initramfs built once is served without the modules directory it was
// built from (a kernel upgrade's autoremove deletes it under a running
// server; every VM create failed after), and a new agent binary gets a
// new one.
func TestInitramfsOutlivesModulesDir(t *testing.T) {
	_, mods, err := Kernel(t.Context(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	copyDir := filepath.Join(t.TempDir(), "modules")
	if out, err := exec.Command("cp", "-a", mods, copyDir).CombinedOutput(); err != nil {
		t.Fatalf("copy modules: %v %s", err, out)
	}
	cache := t.TempDir()
	agent := filepath.Join(t.TempDir(), "agent")
	os.WriteFile(agent, []byte("#!/bin/true\n"), 0o755)
	first, err := Initramfs(t.Context(), cache, copyDir, agent)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(copyDir); err != nil {
		t.Fatal(err)
	}
	if p, err := Initramfs(t.Context(), cache, copyDir, agent); err != nil || p != first {
		t.Fatalf("without its modules dir: %s, %v; want %s", p, err, first)
	}
	os.WriteFile(agent, []byte("#!/bin/true\n# a new build\n"), 0o755)
	if _, err := Initramfs(t.Context(), cache, copyDir, agent); err == nil {
		t.Fatal("a new agent was served the old initramfs")
	}
}
