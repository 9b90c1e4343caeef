package agent

import (
	"os"
	"path/filepath"
	"testing"
)

// TestLookupUserCache: a resolved user is served from the cache while
// /etc/passwd and /etc/group are unchanged, and resolved again after either
// is rewritten or replaced.
func TestLookupUserCache(t *testing.T) {
	dir := t.TempDir()
	passwd, group := filepath.Join(dir, "passwd"), filepath.Join(dir, "group")
	write := func(path, content string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(passwd, "alice:x:1001:1001::/home/alice:/bin/sh\n")
	write(group, "alice:x:1001:\n")
	reads := 0
	uid := uint32(1001)
	oldFiles, oldRead := accountFiles, readAccount
	accountFiles = [2]string{passwd, group}
	readAccount = func(name string) (account, error) {
		reads++
		return account{name: name, uid: uid, gid: 1001, home: "/home/" + name}, nil
	}
	t.Cleanup(func() {
		accountFiles, readAccount = oldFiles, oldRead
		accounts.mu.Lock()
		accounts.byName = nil
		accounts.mu.Unlock()
	})

	lookup := func(wantUID uint32, wantReads int) {
		t.Helper()
		a, err := lookupUser("alice")
		if err != nil || a.uid != wantUID || reads != wantReads {
			t.Fatalf("uid %d err %v after %d reads; want uid %d after %d", a.uid, err, reads, wantUID, wantReads)
		}
	}
	lookup(1001, 1)
	lookup(1001, 1) // cached
	if _, err := lookupUser("bob"); err != nil || reads != 2 {
		t.Fatalf("another user: %v, %d reads", err, reads)
	}

	// Rewritten in place.
	uid = 1002
	write(passwd, "alice:x:1002:1001::/home/alice:/bin/sh\nbob:x:1003:1003::/home/bob:/bin/sh\n")
	lookup(1002, 3)
	lookup(1002, 3)

	// Replaced by a file of the same size and times (a new inode).
	uid = 1004
	st, _ := os.Stat(group)
	tmp := filepath.Join(dir, "group.new")
	write(tmp, "alice:x:1009:\n")
	if err := os.Chtimes(tmp, st.ModTime(), st.ModTime()); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, group); err != nil {
		t.Fatal(err)
	}
	lookup(1004, 4)

	// Removed: a different version too.
	uid = 1005
	if err := os.Remove(group); err != nil {
		t.Fatal(err)
	}
	lookup(1005, 5)
	lookup(1005, 5)
}
