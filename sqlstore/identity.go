package sqlstore

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/jmoiron/sqlx"

	"github.com/wmoutbox/outbox/recordstore"
)

// identityVersion is the schema version that gave tables an identity.
const identityVersion = 4

// newIdentity returns a random table identity: 32 hex characters.
func newIdentity() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails on supported platforms
	return hex.EncodeToString(b[:])
}

// Identity implements [recordstore.Store]: the identity Migrate gave the table,
// kept with its schema version in [VersionTable]. It is read once per
// attached pool; afterwards it costs one atomic load. Before the table is
// migrated it returns an error wrapping [ErrTableMissing] or
// [ErrSchemaVersion] that says to run [Store.Migrate].
func (s *Store) Identity(ctx context.Context) (string, error) {
	if a := s.att.Load(); a != nil && a.identity != "" {
		return a.identity, nil
	}
	db, _, err := s.bound(ctx)
	if err != nil {
		return "", err
	}
	return s.identityThrough(ctx, db, db)
}

// IdentityTx implements [recordstore.TxInserter]: the table's identity, read
// through tx when it is not known yet, so that a caller holding the only
// connection of the pool in tx does not wait for a second one.
func (s *Store) IdentityTx(ctx context.Context, tx recordstore.Tx) (string, error) {
	a := s.att.Load()
	if a != nil && a.identity != "" {
		return a.identity, nil
	}
	if a == nil {
		return "", ErrNoDB
	}
	if a.err != nil {
		return "", a.err
	}
	return s.identityThrough(ctx, tx, a.db)
}

// identityThrough reads the identity through q and keeps it with the
// attachment of db.
func (s *Store) identityThrough(ctx context.Context, q executor, db *sqlx.DB) (string, error) {
	version, _, err := s.readVersion(ctx, q)
	switch {
	case errors.Is(err, ErrTableMissing) || (err == nil && version == 0):
		return "", &TableError{Table: s.table, Op: "read identity", Err: ErrTableMissing}
	case err != nil:
		return "", err
	case version < identityVersion:
		return "", &TableError{Table: s.table, Op: "read identity", Err: fmt.Errorf("%w: table is at version %d, which has no identity; run Store.Migrate", ErrSchemaVersion, version)}
	}
	identity, err := s.readIdentity(ctx, q)
	if err != nil {
		return "", err
	}
	if identity == "" {
		return "", &TableError{Table: s.table, Op: "read identity", Err: fmt.Errorf("%w: table has no identity; run Store.Migrate", ErrSchemaVersion)}
	}
	s.cacheIdentity(db, identity)
	return identity, nil
}

// readIdentity reads the table's identity, "" when it has none yet.
func (v *versioned) readIdentity(ctx context.Context, q executor) (string, error) {
	var identity sql.NullString
	err := q.QueryRowContext(ctx, v.vq.readIdentity, v.name.name).Scan(&identity)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return "", v.fail("read identity", err)
	}
	return identity.String, nil
}

// cacheIdentity keeps the identity with the attachment of db, unless
// another pool was attached meanwhile.
func (s *Store) cacheIdentity(db *sqlx.DB, identity string) {
	for {
		a := s.att.Load()
		if a == nil || a.db != db || a.identity == identity {
			return
		}
		b := *a
		b.identity = identity
		if s.att.CompareAndSwap(a, &b) {
			return
		}
	}
}
