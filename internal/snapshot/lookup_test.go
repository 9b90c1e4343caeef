package snapshot

import (
	"archive/tar"
	"path/filepath"
	"reflect"
	"testing"
)

// TestLookupLayered checks the one-path lookup against Merge, path by
// path, over two and three layers with every way a layer hides what is
// below it: whiteouts of files and of directories (both conventions),
// opaque directories (both conventions), a directory replaced by a file
// and a file by a directory.
func TestLookupLayered(t *testing.T) {
	s := newStore(t)
	tmpl := t.TempDir()
	for p, body := range map[string]string{
		"etc/passwd": "root", "etc/hosts": "h", "etc/motd": "motd",
		"usr/lib/a.so": "a", "usr/lib/deep/b.so": "b",
		"var/cache/x/1": "1", "var/cache/x/2": "2", "opt/app/old": "old",
		"srv/data/file": "f", "home/u/notes": "n", "keep/file": "k",
	} {
		writeFile(t, filepath.Join(tmpl, p), []byte(body), 0o644)
	}
	base, err := s.PutDir(t.Context(), "template", tmpl, Meta{Kind: KindFiles})
	if err != nil {
		t.Fatal(err)
	}
	upper := mustPutTar(t, s, "upper", mkTar(t,
		dir("etc"),
		file("etc/.wh.motd", nil),
		file("etc/hosts", []byte("changed")),
		file("etc/new", []byte("new")),
		dir("usr"),
		item{hdr: tar.Header{Typeflag: tar.TypeChar, Name: "usr/lib", ModTime: t0}}, // overlayfs whiteout of a dir
		dir("var"), dir("var/cache"),
		dir("var/cache/x"), file("var/cache/x/.wh..wh..opq", nil), file("var/cache/x/3", []byte("3")),
		dir("opt"),
		item{hdr: tar.Header{Typeflag: tar.TypeDir, Name: "opt/app/", Mode: 0o700, ModTime: t0,
			PAXRecords: map[string]string{"SCHILY.xattr.trusted.overlay.opaque": "y"}}},
		file("srv/data", []byte("now a file")),
		dir("home"), dir("home/u"), file("home/u/notes", []byte("n2")),
	), Meta{})
	top := mustPutTar(t, s, "top", mkTar(t,
		dir("etc"),
		file("etc/motd", []byte("back")),                                 // back after a lower whiteout
		file("etc/.wh.new", nil),                                         // the middle layer's file removed
		file(".wh.home", nil),                                            // a whole tree, from both layers below
		dir("srv"), dir("srv/data"), file("srv/data/again", []byte("a")), // a directory again over the middle's file
		dir("var"), dir("var/cache"), file("var/cache/.wh..wh..opq", nil), // opaque over two layers
	), Meta{})
	probe := []string{"", "nope", "etc/nope", "usr/lib/deep", "usr/lib/deep/b.so", "srv/data/file",
		"var/cache/x/1", "var/cache/x/3", "opt/app/old", "home/u", "home/u/notes", "/etc/hosts", "etc/../etc/hosts", "../x"}
	for _, m := range []*Manifest{base, upper, top} {
		for _, e := range m.Entries {
			probe = append(probe, e.Path)
		}
	}
	for _, layers := range [][]*Manifest{{base}, {base, upper}, {base, upper, top}, {base, nil, top}} {
		view := &Manifest{}
		for _, l := range layers {
			view = Merge(view, l)
		}
		for _, p := range probe {
			want, wok := view.Lookup(p)
			if p == "" || p == "../x" {
				want, wok = FileEntry{}, false
			}
			got, gok := LookupLayered(p, layers...)
			if gok != wok || !reflect.DeepEqual(got, want) {
				t.Errorf("%d layers, %q: LookupLayered = %v %+v; Merge says %v %+v", len(layers), p, gok, got, wok, want)
			}
		}
	}
	// Spot checks of what the comparison covers, so a Merge that changed
	// its meaning too would not pass unseen.
	layers := []*Manifest{base, upper, top}
	for p, want := range map[string]bool{
		"etc/motd": true, "etc/new": false, "etc/hosts": true, "usr/lib/a.so": false, "home/u/notes": false,
		"srv/data/file": false, "srv/data/again": true, "var/cache/x/3": false, "keep/file": true, "opt/app/old": false,
	} {
		if _, ok := LookupLayered(p, layers...); ok != want {
			t.Errorf("%s: exists = %v, want %v", p, ok, want)
		}
	}
	if e, _ := LookupLayered("opt/app", base, upper); e.Type != TypeDir || e.Mode != 0o700 {
		t.Errorf("opaque opt/app = %+v, want a plain directory", e)
	}
}
