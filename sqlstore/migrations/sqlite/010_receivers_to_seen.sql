ALTER TABLE {{.ReceiversTable}} RENAME TO {{.SeenName}};
