package vmimage

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spacesandbox/space/internal/digest"
	"github.com/spacesandbox/space/internal/errdefs"
)

// KernelPackage is the Debian package the guest kernel comes from.
const KernelPackage = "linux-image-cloud-amd64"

// Kernel returns the uncompressed guest kernel (vmlinux, bootable by QEMU's
// microvm through PVH) and the directory of its modules. The kernel is the
// newest installed /boot/vmlinuz-*-cloud-amd64; its LZ4 payload is
// extracted once into cacheDir. Errors: errdefs.ErrUnavailable when no
// cloud kernel is installed (apt-get install linux-image-cloud-amd64).
func Kernel(ctx context.Context, cacheDir string) (vmlinux, modulesDir string, err error) {
	return kernelFrom(ctx, cacheDir, "/boot", "/lib/modules")
}

func kernelFrom(ctx context.Context, cacheDir, bootDir, modRoot string) (string, string, error) {
	matches, _ := filepath.Glob(filepath.Join(bootDir, "vmlinuz-*-cloud-amd64"))
	if len(matches) == 0 {
		return "", "", errdefs.Unavailable("vmimage: no guest kernel in %s: apt-get install -y %s", bootDir, KernelPackage)
	}
	// The newest release: 6.1.0-10 is newer than 6.1.0-9.
	vmlinuz := slices.MaxFunc(matches, func(a, b string) int {
		return compareVersions(filepath.Base(a), filepath.Base(b))
	})
	release := strings.TrimPrefix(filepath.Base(vmlinuz), "vmlinuz-")
	modulesDir := filepath.Join(modRoot, release)
	if !exists(filepath.Join(modulesDir, "modules.dep")) {
		return "", "", errdefs.Unavailable("vmimage: modules of kernel %s missing in %s: reinstall %s", release, modulesDir, KernelPackage)
	}
	sum, err := digest.File(vmlinuz)
	if err != nil {
		return "", "", fmt.Errorf("vmimage: %w", err)
	}
	path, err := cached(ctx, filepath.Join(cacheDir, "kernel"), release+"-"+sum[:16]+".vmlinux", checkVmlinux, func(tmp string) error {
		b, err := os.ReadFile(vmlinuz)
		if err != nil {
			return err
		}
		elf, err := ExtractVmlinux(b)
		if err != nil {
			return fmt.Errorf("vmimage: %s: %w", vmlinuz, err)
		}
		return os.WriteFile(tmp, elf, 0o644)
	})
	return path, modulesDir, err
}

// checkVmlinux tells a usable cached kernel: an ELF file of a kernel's
// size (Debian's cloud kernel is ~50 MiB uncompressed).
func checkVmlinux(path string) error {
	return checkFile(path, 1<<20, 0, []byte("\x7fELF"))
}

// compareVersions orders version strings as dpkg does: runs of digits
// compare as numbers, other runs character by character with letters
// before other characters and '~' before anything, even the end. So
// 6.1.0-9 < 6.1.0-10 and 6.12.9+deb13 < 6.12.38+deb13, where a string
// sort says the opposite.
func compareVersions(a, b string) int {
	isDigit := func(c byte) bool { return '0' <= c && c <= '9' }
	order := func(s string, i int) int {
		switch {
		case i >= len(s) || isDigit(s[i]):
			return 0
		case s[i] == '~':
			return -1
		case 'a' <= s[i]|0x20 && s[i]|0x20 <= 'z':
			return int(s[i])
		default:
			return int(s[i]) + 256
		}
	}
	for a != "" || b != "" {
		i, j := 0, 0
		for i < len(a) && !isDigit(a[i]) || j < len(b) && !isDigit(b[j]) {
			if c := cmp.Compare(order(a, i), order(b, j)); c != 0 {
				return c
			}
			if i < len(a) && !isDigit(a[i]) {
				i++
			}
			if j < len(b) && !isDigit(b[j]) {
				j++
			}
		}
		a, b = a[i:], b[j:]
		// Digit runs: leading zeros dropped, a longer run is larger (no
		// overflow on long runs).
		i, j = 0, 0
		for i < len(a) && isDigit(a[i]) {
			i++
		}
		for j < len(b) && isDigit(b[j]) {
			j++
		}
		na, nb := strings.TrimLeft(a[:i], "0"), strings.TrimLeft(b[:j], "0")
		if c := cmp.Or(cmp.Compare(len(na), len(nb)), strings.Compare(na, nb)); c != 0 {
			return c
		}
		a, b = a[i:], b[j:]
	}
	return 0
}

// ExtractVmlinux returns the ELF kernel inside an x86 bzImage whose payload
// is LZ4-compressed (the kernel's legacy LZ4 framing), as Debian's kernels
// are. The payload is located with the boot protocol's payload_offset and
// payload_length header fields.
func ExtractVmlinux(bz []byte) ([]byte, error) {
	if len(bz) < 0x250 || string(bz[0x202:0x206]) != "HdrS" {
		return nil, errors.New("not a bzImage")
	}
	setupSects := int(bz[0x1f1])
	if setupSects == 0 {
		setupSects = 4
	}
	pm := (setupSects + 1) * 512
	off := pm + int(binary.LittleEndian.Uint32(bz[0x248:]))
	n := int(binary.LittleEndian.Uint32(bz[0x24c:]))
	if off < 0 || n < 8 || off+n > len(bz) {
		return nil, errors.New("bzImage payload out of range")
	}
	payload := bz[off : off+n]
	if !bytes.HasPrefix(payload, []byte{0x02, 0x21, 0x4c, 0x18}) {
		return nil, fmt.Errorf("bzImage payload is not LZ4 (magic % x)", payload[:4])
	}
	// The kernel build appends the uncompressed size as 4 bytes.
	size := int(binary.LittleEndian.Uint32(payload[len(payload)-4:]))
	out, err := decodeLZ4Legacy(payload[:len(payload)-4], size)
	if err != nil {
		return nil, err
	}
	if !bytes.HasPrefix(out, []byte("\x7fELF")) {
		return nil, errors.New("decompressed payload is not an ELF kernel")
	}
	return out, nil
}

// decodeLZ4Legacy decodes the LZ4 legacy frame format: a magic number,
// then blocks each prefixed by its compressed size (4 bytes LE) and each
// decompressing to at most 8 MiB. The frame has no end marker, so the
// output must come to size, the length the kernel build recorded: a
// truncated or corrupt payload that still starts with an ELF header is
// refused.
func decodeLZ4Legacy(in []byte, size int) ([]byte, error) {
	const magic = 0x184c2102
	out := make([]byte, 0, size)
	for len(in) >= 4 {
		if binary.LittleEndian.Uint32(in) == magic {
			in = in[4:]
			continue
		}
		bs := int(binary.LittleEndian.Uint32(in))
		in = in[4:]
		if bs == 0 || bs > len(in) {
			break
		}
		var err error
		out, err = decodeLZ4Block(in[:bs], out)
		if err != nil {
			return nil, err
		}
		in = in[bs:]
	}
	if len(out) != size {
		return nil, fmt.Errorf("LZ4 payload decoded to %d bytes, want %d", len(out), size)
	}
	return out, nil
}

// decodeLZ4Block appends the decoding of one LZ4 block to dst. Matches may
// reach back into earlier blocks (the legacy format's blocks are dependent
// only within themselves, but dst holds all output so either works).
func decodeLZ4Block(src, dst []byte) ([]byte, error) {
	bad := errors.New("corrupt LZ4 block")
	i := 0
	for i < len(src) {
		tok := src[i]
		i++
		lit := int(tok >> 4)
		if lit == 15 {
			for {
				if i >= len(src) {
					return nil, bad
				}
				b := src[i]
				i++
				lit += int(b)
				if b != 255 {
					break
				}
			}
		}
		if i+lit > len(src) {
			return nil, bad
		}
		dst = append(dst, src[i:i+lit]...)
		i += lit
		if i == len(src) {
			break // the last sequence has literals only
		}
		if i+2 > len(src) {
			return nil, bad
		}
		off := int(src[i]) | int(src[i+1])<<8
		i += 2
		ml := int(tok & 15)
		if ml == 15 {
			for {
				if i >= len(src) {
					return nil, bad
				}
				b := src[i]
				i++
				ml += int(b)
				if b != 255 {
					break
				}
			}
		}
		ml += 4
		if off == 0 || off > len(dst) {
			return nil, bad
		}
		start := len(dst) - off
		if off >= ml {
			dst = append(dst, dst[start:start+ml]...)
		} else {
			for k := 0; k < ml; k++ {
				dst = append(dst, dst[start+k])
			}
		}
	}
	return dst, nil
}
