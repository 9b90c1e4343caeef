package vmimage

import (
	"bytes"
	"context"
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

// TestKernel extracts the installed cloud kernel (the real thing VMs boot)
// and checks the modules the initramfs needs resolve with dependencies first.
func TestKernel(t *testing.T) {
	cache := t.TempDir()
	vmlinux, mods, err := Kernel(t.Context(), cache)
	if err != nil {
		t.Fatalf("%v (the qemu driver needs it: apt-get install -y %s)", err, KernelPackage)
	}
	b, err := os.ReadFile(vmlinux)
	if err != nil || !bytes.HasPrefix(b, []byte("\x7fELF")) || len(b) < 10<<20 {
		t.Fatalf("vmlinux %s: %d bytes, %v", vmlinux, len(b), err)
	}
	again, _, err := Kernel(t.Context(), cache)
	if err != nil || again != vmlinux {
		t.Fatalf("second Kernel: %s, %v", again, err)
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
	if _, err := RootImage(t.Context(), cache, root, "../bad"); err == nil {
		t.Error("bad digest accepted")
	}
}
