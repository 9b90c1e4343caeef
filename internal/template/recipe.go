// Package template owns template builds and their on-disk cache.
//
// A template is a read-only root filesystem plus metadata (name, digest,
// size, recipe, build time). Sandboxes share it read-only. Today a template
// is built from Debian packages with mmdebstrap into a directory (KindDir),
// which gVisor uses as is. VM drivers will need a raw ext4 image made from
// the same recipe (KindRaw): that is a second artifact of the same cache
// entry, to be produced from the finished rootfs, not a second recipe.
//
// The cache is content-addressed: <cache>/<digest>/ holds rootfs/ and
// template.json, and a directory only appears under its digest once the
// build is complete (it is built beside it and renamed into place).
// Builds of one digest are serialized across processes by an flock on
// <cache>/<digest>.lock.
package template

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"regexp"
	"slices"
	"strings"

	"github.com/spacesandbox/space/internal/errdefs"
)

// BuilderVersion is hashed into every recipe digest. Bump it whenever the
// build logic changes what a recipe produces (mmdebstrap options, hooks),
// so cached templates built the old way are not reused.
//
// 2: every template gets /etc/hosts (localhost), no host resolv.conf,
// /etc/hostname 0644 and no build-only dpkg options (hostsHook and
// finalHooks in builder.go).
const BuilderVersion = 2

// Recipe defaults.
const (
	DefaultSuite   = "bookworm"
	DefaultVariant = "minbase"
	DefaultMirror  = "http://deb.debian.org/debian"
)

// Recipe says how to build a template from Debian packages.
type Recipe struct {
	Name        string   `json:"name"`
	Description string   `json:"description,omitempty"`
	Suite       string   `json:"suite,omitempty"`   // Debian suite; DefaultSuite if empty
	Variant     string   `json:"variant,omitempty"` // mmdebstrap variant; DefaultVariant if empty
	Mirror      string   `json:"mirror,omitempty"`  // DefaultMirror if empty
	Packages    []string `json:"packages,omitempty"`
	// Customize are shell commands run, in order, inside the finished
	// rootfs (chroot, /bin/sh -c) after the packages are installed.
	Customize []string `json:"customize,omitempty"`
}

// normalized fills defaults and sorts and dedups Packages (their order does
// not change what apt installs), so equivalent recipes share a digest.
func (r Recipe) normalized() Recipe {
	if r.Suite == "" {
		r.Suite = DefaultSuite
	}
	if r.Variant == "" {
		r.Variant = DefaultVariant
	}
	if r.Mirror == "" {
		r.Mirror = DefaultMirror
	}
	r.Packages = slices.Compact(slices.Sorted(slices.Values(r.Packages)))
	if len(r.Packages) == 0 {
		r.Packages = nil
	}
	if len(r.Customize) == 0 {
		r.Customize = nil
	}
	return r
}

// Digest identifies what the recipe builds: the SHA-256 (hex) of the
// canonical JSON of the normalized recipe and BuilderVersion. The
// description is left out, so rewording it does not force a rebuild.
func (r Recipe) Digest() string {
	n := r.normalized()
	n.Description = ""
	b, err := json.Marshal(struct {
		Builder int    `json:"builder"`
		Recipe  Recipe `json:"recipe"`
	}{BuilderVersion, n})
	if err != nil {
		panic("template: marshal recipe: " + err.Error()) // strings only: cannot fail
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

var (
	nameRE    = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	wordRE    = regexp.MustCompile(`^[a-z0-9][a-z0-9.+-]*$`)
	packageRE = regexp.MustCompile(`^[a-z0-9][a-z0-9.+-]*(:[a-z0-9-]+)?(=[A-Za-z0-9.+~:-]+)?$`)
)

// Validate reports whether the recipe can be built. Errors:
// errdefs.ErrInvalidArgument. Package and suite names are checked strictly
// because they become mmdebstrap arguments.
func (r Recipe) Validate() error {
	n := r.normalized()
	if !nameRE.MatchString(n.Name) {
		return errdefs.InvalidArgument("template name %q: use lower-case letters, digits, '.', '_' and '-'", n.Name)
	}
	if !wordRE.MatchString(n.Suite) {
		return errdefs.InvalidArgument("template %s: bad suite %q", n.Name, n.Suite)
	}
	if !wordRE.MatchString(n.Variant) {
		return errdefs.InvalidArgument("template %s: bad variant %q", n.Name, n.Variant)
	}
	if !strings.HasPrefix(n.Mirror, "http://") && !strings.HasPrefix(n.Mirror, "https://") && !strings.HasPrefix(n.Mirror, "file://") ||
		strings.ContainsAny(n.Mirror, " \t\n") {
		return errdefs.InvalidArgument("template %s: bad mirror %q", n.Name, n.Mirror)
	}
	for _, p := range n.Packages {
		if !packageRE.MatchString(p) {
			return errdefs.InvalidArgument("template %s: bad package name %q", n.Name, p)
		}
	}
	for _, c := range n.Customize {
		if strings.TrimSpace(c) == "" {
			return errdefs.InvalidArgument("template %s: empty customize command", n.Name)
		}
	}
	return nil
}

// basePackages are what every built-in template has.
var basePackages = []string{
	"bash", "coreutils", "python3", "nodejs", "git", "curl", "ca-certificates",
	"procps", "less", "file", "passwd", "python3-requests", "sudo",
}

// baseCustomize sets up the sandbox user and trims the image.
var baseCustomize = []string{
	"getent group user >/dev/null || groupadd --gid 1000 user",
	"id user >/dev/null 2>&1 || useradd --uid 1000 --gid 1000 --create-home --home-dir /home/user --shell /bin/bash user",
	// Passwordless sudo, as E2B's default user has: inside the sandbox
	// only (docs/SECURITY.md says why it changes nothing at the boundary).
	`printf 'user ALL=(ALL:ALL) NOPASSWD: ALL\n' > /etc/sudoers.d/user && chmod 0440 /etc/sudoers.d/user`,
	"echo sandbox > /etc/hostname",
	// Every driver names the guest "sandbox"; a server that resolves its
	// own hostname (as some bind or log it) must not fail. The builder
	// wrote the localhost lines before these commands.
	`printf '127.0.0.1\tsandbox\n' >> /etc/hosts`,
	// Every shell command is a bash login shell (as in E2B), and Debian's
	// /etc/profile forks id(1) to tell root from others: ~60 ms of the
	// ~110 ms a `bash -lc true` took in gVisor. bash knows $EUID; sh
	// still falls back to id.
	`sed -i 's/"$(id -u)"/"${EUID:-$(id -u)}"/g' /etc/profile`,
	"chmod 1777 /tmp",
	"rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/apt/archives/*.deb /var/cache/debconf/*-old /var/log/apt/* /var/log/dpkg.log /usr/share/doc/* /usr/share/man/* /usr/share/info/*",
}

// Base is the default template: a small Debian with a shell, Python,
// Node.js and git, and a user "user" (uid/gid 1000, home /home/user) with
// passwordless sudo.
func Base() Recipe {
	return Recipe{
		Name:        "base",
		Description: "Debian bookworm with bash, python3, nodejs, git and curl; user 'user' (1000) with passwordless sudo",
		Suite:       DefaultSuite,
		Variant:     DefaultVariant,
		Mirror:      DefaultMirror,
		Packages:    slices.Clone(basePackages),
		Customize:   slices.Clone(baseCustomize),
	}
}

// PythonData is Base plus the Python data stack (pandas, numpy,
// matplotlib, pip).
func PythonData() Recipe {
	r := Base()
	r.Name = "python-data"
	r.Description = "base plus python3 pandas, numpy, matplotlib, pip and IPython"
	// IPython: the code interpreter runs cells in an InteractiveShell, as
	// E2B's Jupyter kernel does (magics, shell escapes, its formatters).
	r.Packages = append(r.Packages, "python3-pandas", "python3-numpy", "python3-matplotlib", "python3-pip", "python3-ipython")
	// matplotlib builds its font list on its first import and writes it
	// to the home directory: ~0.3 s of every sandbox's first plot, and a
	// file the code interpreter's prestarted kernel would leave behind in
	// a sandbox claimed without it. Built once here, for user and root.
	r.Customize = append(r.Customize,
		"HOME=/home/user python3 -c 'import matplotlib.font_manager' && chown -R user:user /home/user/.cache /home/user/.config",
		"HOME=/root python3 -c 'import matplotlib.font_manager'")
	return r
}

// Builtins returns the built-in recipes.
func Builtins() []Recipe {
	return []Recipe{Base(), PythonData()}
}

// Builtin returns the built-in recipe called name. Errors:
// errdefs.ErrNotFound.
func Builtin(name string) (Recipe, error) {
	for _, r := range Builtins() {
		if r.Name == name {
			return r, nil
		}
	}
	return Recipe{}, errdefs.NotFound("no built-in template %q", name)
}
