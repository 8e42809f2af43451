RENAME TABLE {{.ReceiversTable}} TO {{.SeenTable}};
