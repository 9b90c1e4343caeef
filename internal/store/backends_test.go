package store

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/spacesandbox/space/internal/store/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// opener opens a Store on its test's database (closed when the test
// ends); each call opens another Store on the same database, as another
// process (or replica) would.
type opener func() *Store

// backend is one database the store runs on: newDB makes a fresh one and
// returns what OpenDatabase opens it by.
type backend struct {
	name  string
	newDB func(tb testing.TB) string
}

var backends = []backend{
	{"sqlite", func(tb testing.TB) string { return filepath.Join(tb.TempDir(), "space.db") }},
	{"postgres", pgtest.URL},
}

// forBackends runs f once on each backend, as subtests named after it,
// each on a fresh database.
func forBackends(t *testing.T, f func(t *testing.T, open opener)) {
	forDatabases(t, func(t *testing.T, database string) {
		f(t, func() *Store { return openTB(t, database) })
	})
}

// forDatabases is forBackends for a test that opens the database itself.
func forDatabases(t *testing.T, f func(t *testing.T, database string)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) { f(t, b.newDB(t)) })
	}
}

// benchBackends is forBackends for a benchmark.
func benchBackends(b *testing.B, f func(b *testing.B, open opener)) {
	for _, be := range backends {
		b.Run(be.name, func(b *testing.B) {
			database := be.newDB(b)
			f(b, func() *Store { return openTB(b, database) })
		})
	}
}

// openTB opens database (a SQLite path or a Postgres URL), closed when tb
// ends.
func openTB(tb testing.TB, database string) *Store {
	tb.Helper()
	s, err := OpenDatabase(tb.Context(), database)
	if err != nil {
		tb.Fatalf("Open: %v", err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}
