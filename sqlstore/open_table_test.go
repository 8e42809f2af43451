package sqlstore_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmoutbox/outbox/internal/testenv"
	"github.com/wmoutbox/outbox/sqlstore"
)

func TestOpenTable(t *testing.T) {
	t.Parallel()
	testenv.ForEachBackend(t, func(t *testing.T, b testenv.Backend) {
		db := b.Open(t)
		for _, mode := range []sqlstore.Completion{sqlstore.Mark, sqlstore.Delete} {
			t.Run(mode.String(), func(t *testing.T) {
				created := testenv.NewStore(t, b, db, mode)
				s, err := sqlstore.OpenTable(testCtx(t), db, b.Dialect, created.Table())
				require.NoError(t, err)
				assert.Equal(t, mode, s.Completion(), "the mode the table was created with")
				assert.Equal(t, created.Table(), s.Table())
				_, err = s.Status(testCtx(t))
				assert.NoError(t, err)
			})
		}
		t.Run("Missing", func(t *testing.T) {
			_, err := sqlstore.OpenTable(testCtx(t), db, b.Dialect, testenv.Table(t))
			require.ErrorIs(t, err, sqlstore.ErrTableMissing)
			assert.Contains(t, err.Error(), "("+b.Dialect.Name()+", database ")
		})
		t.Run("DriverMismatch", func(t *testing.T) {
			other := sqlstore.Postgres()
			if b.Dialect.Name() == other.Name() {
				other = sqlstore.SQLite()
			}
			_, err := sqlstore.OpenTable(testCtx(t), db, other, "")
			assert.ErrorIs(t, err, sqlstore.ErrInvalidConfig)
		})
	})
}
