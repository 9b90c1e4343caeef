package template

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/spacesandbox/space/internal/errdefs"
)

func TestDigestStable(t *testing.T) {
	r := Base()
	d := r.Digest()
	if len(d) != 64 {
		t.Fatalf("digest %q is not hex sha256", d)
	}
	if d != Base().Digest() {
		t.Fatal("digest differs between calls")
	}
	// Package order, duplicates, the description and spelled-out defaults
	// do not change what is built.
	same := Base()
	slices.Reverse(same.Packages)
	same.Packages = append(same.Packages, "git")
	same.Description = "reworded"
	if same.Digest() != d {
		t.Error("digest depends on package order, duplicates or description")
	}
	a := Recipe{Name: "x", Packages: []string{"curl"}}
	b := Recipe{Name: "x", Suite: DefaultSuite, Variant: DefaultVariant, Mirror: DefaultMirror, Packages: []string{"curl"}}
	if a.Digest() != b.Digest() {
		t.Error("defaults not applied before hashing")
	}
	// Pinned value: if this changes, cached templates are rebuilt. Bump
	// BuilderVersion on purpose rather than changing the hashing by accident.
	if got := (Recipe{Name: "pin"}).Digest(); got != pinnedDigest {
		t.Errorf("digest of a fixed recipe changed: %s (update pinnedDigest only with a BuilderVersion bump)", got)
	}
}

const pinnedDigest = "adf897bcd75baad5a4c88bcbc297ad62755c9375bddc88e7caf52e0d4a2d415f"

func TestDigestDiffers(t *testing.T) {
	base := Base()
	variants := map[string]func(*Recipe){
		"name":      func(r *Recipe) { r.Name = "other" },
		"suite":     func(r *Recipe) { r.Suite = "trixie" },
		"variant":   func(r *Recipe) { r.Variant = "apt" },
		"mirror":    func(r *Recipe) { r.Mirror = "http://mirror.example/debian" },
		"package":   func(r *Recipe) { r.Packages = append(r.Packages, "vim") },
		"customize": func(r *Recipe) { r.Customize = append(r.Customize, "true") },
		"order":     func(r *Recipe) { slices.Reverse(r.Customize) },
	}
	seen := map[string]string{base.Digest(): "base"}
	for name, mutate := range variants {
		r := Base()
		mutate(&r)
		d := r.Digest()
		if prev, ok := seen[d]; ok {
			t.Errorf("changing %s gives the same digest as %s", name, prev)
		}
		seen[d] = name
	}
	if PythonData().Digest() == base.Digest() {
		t.Error("python-data and base share a digest")
	}
}

func TestValidate(t *testing.T) {
	for _, r := range Builtins() {
		if err := r.Validate(); err != nil {
			t.Errorf("built-in %s: %v", r.Name, err)
		}
	}
	bad := []Recipe{
		{Name: ""},
		{Name: "Upper"},
		{Name: "x", Packages: []string{"--root=/"}},
		{Name: "x", Packages: []string{"a,b"}},
		{Name: "x", Packages: []string{"a b"}},
		{Name: "x", Suite: "-x"},
		{Name: "x", Variant: "a b"},
		{Name: "x", Mirror: "ftp://x"},
		{Name: "x", Customize: []string{"  "}},
	}
	for _, r := range bad {
		if err := r.Validate(); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Validate(%+v) = %v, want invalid argument", r, err)
		}
	}
	if err := (Recipe{Name: "x", Packages: []string{"libc6:amd64", "python3=3.11.2-1+b1", "g++"}}).Validate(); err != nil {
		t.Errorf("valid package names rejected: %v", err)
	}
}

func TestBuiltin(t *testing.T) {
	r, err := Builtin("python-data")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range append(slices.Clone(basePackages), "python3-pandas", "python3-numpy", "python3-matplotlib", "python3-pip", "python3-ipython") {
		if !slices.Contains(r.Packages, p) {
			t.Errorf("python-data lacks %s", p)
		}
	}
	if _, err := Builtin("nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Builtin(nope) = %v", err)
	}
	// Built-ins must not share slices: mutating one leaves the next intact.
	b := Base()
	b.Packages[0] = "changed"
	if Base().Packages[0] == "changed" {
		t.Error("Base shares its package slice")
	}
}

func TestMmdebstrapArgs(t *testing.T) {
	r := Base().normalized()
	args := mmdebstrapArgs(r, "/x/rootfs")
	joined := strings.Join(args, "\n")
	for _, want := range []string{
		"--mode=root", "--variant=minbase", `--aptopt=Acquire::Languages "none"`,
		`--aptopt=APT::Install-Recommends "false"`, "--dpkgopt=path-exclude=/usr/share/doc/*",
		"--include=" + strings.Join(r.Packages, ","),
		`--customize-hook=chroot "$1" /bin/sh -c 'chmod 1777 /tmp'`,
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("args lack %q:\n%s", want, joined)
		}
	}
	// The builder's hooks wrap the recipe's: /etc/hosts first (the
	// recipe adds its hostname), the clean-up of the build's leftovers
	// (host resolv.conf, dpkg options) after everything that may need them.
	var hooks []string
	for _, a := range args {
		if c, ok := strings.CutPrefix(a, `--customize-hook=chroot "$1" /bin/sh -c `); ok {
			hooks = append(hooks, c)
		}
	}
	var want []string
	for _, c := range slices.Concat(hostsHook, r.Customize, finalHooks) {
		want = append(want, shellQuote(c))
	}
	if !slices.Equal(hooks, want) {
		t.Fatalf("hooks =\n%s\nwant\n%s", strings.Join(hooks, "\n"), strings.Join(want, "\n"))
	}
	if !strings.Contains(hostsHook[0], `'127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' > /etc/hosts`) {
		t.Errorf("first hook %s does not write /etc/hosts", hostsHook[0])
	}
	if i := slices.Index(r.Customize, `printf '127.0.0.1\tsandbox\n' >> /etc/hosts`); i < 0 || i < slices.Index(r.Customize, "echo sandbox > /etc/hostname") {
		t.Errorf("base does not add its hostname to /etc/hosts after setting it: %q", r.Customize)
	}
	last := strings.Join(finalHooks, "\n")
	for _, want := range []string{"rm -f /etc/resolv.conf", "chmod 0644 /etc/hostname", "rm -f /etc/dpkg/dpkg.cfg.d/99mmdebstrap"} {
		if !strings.Contains(last, want) {
			t.Errorf("last hooks lack %q:\n%s", want, last)
		}
	}
	if n := len(args); args[n-3] != "bookworm" || args[n-2] != "/x/rootfs" || args[n-1] != DefaultMirror {
		t.Errorf("positional args = %q", args[n-3:])
	}
	if got := shellQuote(`it's`); got != `'it'\''s'` {
		t.Errorf("shellQuote = %s", got)
	}
}

func TestUnescapeMountinfo(t *testing.T) {
	if got := unescapeMountinfo(`/a\040b/c\134d`); got != `/a b/c\d` {
		t.Errorf("got %q", got)
	}
}
