package testenv

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/vmimage"
)

// VMPackages are the Debian packages VM drivers need on the host.
const VMPackages = "qemu-system-x86 qemu-utils e2fsprogs " + vmimage.KernelPackage

// VMCacheDir is the shared cache of guest kernels, initramfs builds and
// root disk images.
func VMCacheDir() string { return filepath.Join(CacheDir(), "vm") }

// QEMU checks that the VM tools and the guest kernel are installed; the
// test fails saying how to install what is missing.
func QEMU(t testing.TB) {
	t.Helper()
	for _, bin := range []string{"qemu-system-x86_64", "qemu-img", "mkfs.ext4"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s not found: apt-get install -y %s", bin, VMPackages)
		}
	}
	if _, _, err := vmimage.Kernel(t.Context(), VMCacheDir()); err != nil {
		t.Fatalf("guest kernel: %v", err)
	}
}

// BaseImage returns the built `base` template as a raw ext4 disk image,
// building the template and then the image into the shared caches on first
// use.
func BaseImage(t testing.TB) string {
	t.Helper()
	tpl := Base(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	img, err := vmimage.RootImage(ctx, VMCacheDir(), tpl.Path, tpl.Digest)
	if err != nil {
		t.Fatalf("base template disk image: %v", err)
	}
	return img
}
